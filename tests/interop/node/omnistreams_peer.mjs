#!/usr/bin/env node
/*
 * Interop test peer for polymux: drives npm `omnistreams` 0.9.0 (its Multiplexer and
 * WebSocketTransport, the older "legacy" numbering: CREATE 0, DATA 1, END 2,
 * TERMINATE_SENDER 3, REQUEST_DATA 4, CONTROL 5) over the `ws` package (Node 20 has no
 * global WebSocket; ws supports the addEventListener API the transport uses).
 * Exact versions are pinned in package.json / package-lock.json.
 *
 *   node omnistreams_peer.mjs --listen --port 0 | --connect --url ws://127.0.0.1:PORT/omnistreams
 *        --mode responder|driver [--channels N=16] [--size BYTES=1048576] [--timeout-ms MS=90000]
 *
 * stdout: `LISTENING <port>` (listen only), then one JSON summary line ({"ok":...}).
 * exit:   0 success, 1 a check failed / unexpected error, 2 bad usage, 3 watchdog.
 *
 * omnistreams streams are one-way (the creator writes). Metadata is a JSON object
 * (omnistreams' encodeObject) with "name" and "chunkSize". What 0.9.0 does, read from
 * its src/: a sender (Consumer) sends whatever it is given, ignoring credit; the
 * application must respect the demand it is told through onRequest(n) -- this peer
 * does. A receiver (Producer) sends REQUEST_DATA through request(n) (one byte: n <= 255).
 * A receiver's terminate() sends TERMINATE_SENDER; a sender's terminate() sends
 * nothing (the package's TODO). END or TERMINATE for an unknown id throws.
 *
 * Responder (polymux drives): for each incoming stream by name
 *   sink/<i>     read to the end, check the pattern (byte j = (j*31 + i*7) & 0xff), then
 *                open `result/<i>` back (metadata adds {"for": "sink/<i>"}) carrying
 *                `<count> <sha256 hex>`, and end it.
 *   cancel/<i>   read until 64 KiB arrived, then terminate() (TERMINATE_SENDER).
 *   control messages are answered with "echo:" + message.
 * It exits once the WebSocket closes.
 *
 * Driver (polymux serves): --channels streams `data/<i>` of --size bytes (the pattern),
 * 64 KiB writes within credit, then end(); polymux answers each with a stream
 * `ack/<i>` carrying `<count> <sha256>`, checked. `meta/x` with metadata
 * {"name","chunkSize","extra":"€ ok"}: polymux answers `ack/meta` with the metadata
 * bytes it received. `cancelme/x`: written within credit until polymux cancels it
 * (onTermination must fire). A control message "ping" must come back as "pong:ping".
 * Then the WebSocket is closed.
 */

import crypto from 'node:crypto'
import { WebSocket, WebSocketServer } from 'ws'
import { Multiplexer, WebSocketTransport, encodeObject, decodeObject } from 'omnistreams'
import { readAll, writeWithinCredit } from './omnistreams_npm.mjs'

const t0 = Date.now()
const opts = { role: null, port: null, url: null, mode: null, channels: 16, size: 1 << 20, timeoutMs: 90000 }

function usage(msg) {
	if (msg) process.stderr.write(`omnistreams_peer: ${msg}\n`)
	process.stderr.write('usage: node omnistreams_peer.mjs --listen --port N | --connect --url URL --mode responder|driver [--channels N] [--size BYTES] [--timeout-ms MS]\n')
	process.exit(2)
}

const argv = process.argv.slice(2)
for (let i = 0; i < argv.length; i++) {
	const a = argv[i]
	const int = () => {
		const v = argv[++i]
		if (v === undefined || !/^\d+$/.test(v)) usage(`${a} needs a non-negative integer`)
		return parseInt(v, 10)
	}
	if (a === '--listen' || a === '--connect') opts.role = a.slice(2)
	else if (a === '--port') opts.port = int()
	else if (a === '--url') opts.url = argv[++i]
	else if (a === '--mode') opts.mode = argv[++i]
	else if (a === '--channels') opts.channels = int()
	else if (a === '--size') opts.size = int()
	else if (a === '--timeout-ms') opts.timeoutMs = int()
	else usage(`unknown argument ${a}`)
}
if (!opts.role) usage('one of --listen/--connect is required')
if (opts.role === 'listen' && opts.port === null) usage('--listen needs --port')
if (opts.role === 'connect' && !opts.url) usage('--connect needs --url')
if (!['responder', 'driver'].includes(opts.mode)) usage('--mode must be responder or driver')

const tag = `[omnistreams_peer ${opts.mode}]`
const log = (...args) => process.stderr.write(`${tag} +${Date.now() - t0}ms ${args.join(' ')}\n`)
const failures = []
const fail = msg => {
	log('FAIL', msg)
	failures.push(msg)
}
const summary = { ok: false, mode: opts.mode }

function finish(code) {
	summary.ok = code === 0 && failures.length === 0
	summary.failures = failures
	summary.elapsed_ms = Date.now() - t0
	process.stdout.write(JSON.stringify(summary) + '\n')
	process.exit(summary.ok ? 0 : 1)
}

setTimeout(() => {
	fail(`watchdog: ${opts.timeoutMs} ms`)
	summary.failures = failures
	process.stdout.write(JSON.stringify(summary) + '\n')
	process.exit(3)
}, opts.timeoutMs).unref()
process.on('uncaughtException', e => {
	fail(`uncaught: ${e && e.stack ? e.stack : e}`)
	finish(1)
})

function pattern(i, size) {
	const buf = Buffer.allocUnsafe(size)
	for (let j = 0; j < size; j++) buf[j] = (j * 31 + i * 7) & 0xff
	return buf
}

const sha256 = buf => crypto.createHash('sha256').update(buf).digest('hex')

function meta(obj) {
	return encodeObject(obj)
}

function run(ws) {
	const mux = new Multiplexer(new WebSocketTransport(ws))
	ws.addEventListener('error', e => fail(`websocket error: ${e.message || e}`))
	if (opts.mode === 'responder') responder(mux, ws)
	else driver(mux, ws).catch(e => {
		fail(`driver: ${e && e.stack ? e.stack : e}`)
		finish(1)
	})
}

function responder(mux, ws) {
	summary.sinks = 0
	summary.cancelled = 0
	summary.controls = []
	summary.metadata = []
	mux.onControlMessage(message => {
		const text = Buffer.from(message).toString()
		summary.controls.push(text)
		mux.sendControlMessage(new Uint8Array(Buffer.from('echo:' + text)))
	})
	mux.onConduit((producer, metadata) => {
		const m = decodeObject(metadata)
		summary.metadata.push(m)
		const name = m.name
		if (typeof name !== 'string' || typeof m.chunkSize !== 'number') fail(`bad metadata ${JSON.stringify(m)}`)
		if (name.startsWith('sink/')) {
			const i = parseInt(name.slice(5), 10)
			readAll(producer).then(buf => {
				const want = pattern(i, opts.size)
				if (!buf.equals(want)) fail(`${name}: ${buf.length} bytes, pattern mismatch`)
				summary.sinks++
				const out = mux.createConduit(meta({ name: `result/${i}`, chunkSize: 65536, for: name }))
				if (out === null) return fail('no stream id for a result')
				writeWithinCredit(out, Buffer.from(`${buf.length} ${sha256(buf)}`))
			}, e => fail(`${name}: ${e.message}`))
		} else if (name.startsWith('cancel/')) {
			let total = 0
			readAll(producer, {
				onChunk: parts => {
					total = parts.reduce((n, p) => n + p.length, 0)
					if (total >= 65536) {
						producer.terminate()
						summary.cancelled++
						return false
					}
				},
			}).catch(() => {})
		} else {
			fail(`unexpected stream ${name}`)
			producer.terminate()
		}
	})
	ws.addEventListener('close', () => {
		log('closed')
		finish(0)
	})
}

async function driver(mux, ws) {
	const acks = new Map()
	const waiters = new Map()
	const waitAck = name =>
		acks.has(name) ? Promise.resolve(acks.get(name)) : new Promise(resolve => waiters.set(name, resolve))
	mux.onConduit((producer, metadata) => {
		const m = decodeObject(metadata)
		readAll(producer).then(buf => {
			acks.set(m.name, { buf, meta: m })
			const w = waiters.get(m.name)
			if (w) w({ buf, meta: m })
		}, e => fail(`${m.name}: ${e.message}`))
	})
	const pong = new Promise(resolve => mux.onControlMessage(message => resolve(Buffer.from(message).toString())))
	mux.sendControlMessage(new Uint8Array(Buffer.from('ping')))

	const started = Date.now()
	const jobs = []
	for (let i = 0; i < opts.channels; i++) {
		const buf = pattern(i, opts.size)
		const name = `data/${i}`
		const out = mux.createConduit(meta({ name, chunkSize: 65536 }))
		if (out === null) throw new Error('no stream id')
		jobs.push(
			writeWithinCredit(out, buf).then(async how => {
				if (how !== 'ended') fail(`${name}: ${how}`)
				const ack = await waitAck(`ack/${i}`)
				const text = ack.buf.toString()
				if (text !== `${buf.length} ${sha256(buf)}`) fail(`${name}: polymux acknowledged "${text}"`)
			})
		)
	}
	await Promise.all(jobs)
	summary.data_ms = Date.now() - started
	summary.data_streams = opts.channels

	const metaBytes = meta({ name: 'meta/x', chunkSize: 1000, extra: '€ ok' })
	const metaOut = mux.createConduit(metaBytes)
	metaOut.end()
	const metaAck = await waitAck('ack/meta')
	if (!metaAck.buf.equals(Buffer.from(metaBytes))) fail(`metadata came back as ${metaAck.buf.toString()}`)
	summary.metadata_echoed = metaAck.buf.toString()

	const cancelOut = mux.createConduit(meta({ name: 'cancelme/x', chunkSize: 65536 }))
	summary.cancel = await writeWithinCredit(cancelOut, pattern(5, 65536), { endless: true })
	if (summary.cancel !== 'terminated') fail(`cancelme: ${summary.cancel}`)

	summary.control = await pong
	if (summary.control !== 'pong:ping') fail(`control answer ${summary.control}`)
	ws.addEventListener('close', () => finish(0))
	ws.close()
}

if (opts.role === 'listen') {
	const wss = new WebSocketServer({ host: '127.0.0.1', port: opts.port })
	wss.on('listening', () => process.stdout.write(`LISTENING ${wss.address().port}\n`))
	wss.on('connection', ws => {
		wss.close()
		run(ws)
	})
} else {
	const ws = new WebSocket(opts.url)
	ws.addEventListener('open', () => run(ws))
	ws.addEventListener('error', e => {
		fail(`cannot connect: ${e.message || e}`)
		finish(1)
	})
}
