#!/usr/bin/env node
/*
 * Interop peer for polymux's own browser client, src/polymux/web/omnistreams.js ("ours"),
 * run in Node over the `ws` package (the module takes any WebSocket-like object).
 *
 *   node webclient_peer.mjs --mode npm                      ours <-> npm omnistreams 0.9.0
 *   node webclient_peer.mjs --mode polymux --url ws://...   ours -> a polymux server (Python)
 *   node webclient_peer.mjs --mode error --url ws://...     ours -> a server that breaks the protocol
 *
 * stdout: one JSON summary line ({"ok": ...}); exit 0 success, 1 a check failed, 2 usage,
 * 3 watchdog.
 *
 * npm: both roles in one process, each over a real WebSocket on 127.0.0.1 (legacy numbering,
 * the only one the package speaks): ours as the client of an npm server, then ours as the
 * server of an npm client. In each: 8 streams of 1 MiB each way (pattern checked, SHA-256
 * acknowledged on a stream opened back), metadata, a cancel by each side, control messages
 * both ways, and openPair() failing with a timeout (the npm package does not answer pairs).
 * The npm sender ignores credit by itself; this peer writes within the credit it is told,
 * and ours would end the session on a message beyond it.
 *
 * polymux: the Python side (tests/interop/test_webclient_interop.py) serves by name:
 *   echo/<i>  pairs: echo until our end, then close   -> 8 pairs of 2 MiB at once, checked
 *   sink      a one-way stream: polymux answers on a control message "sink <count> <sha256>"
 *   flood     pair: polymux writes forever; we read 256 KiB then cancel reading; polymux
 *             reports the reset it got on a control message "flood <error>"
 *   stopper   pair: polymux reads 64 KiB, then closes: our writes fail with code 'cancelled'
 *   hold      pair: polymux does not read; we cancel while a write waits for credit; polymux
 *             reports what its reader got on a control message "hold <error>"
 *   control "push": polymux opens a one-way stream `push` (1 MiB pattern 9) and a pair `ask`
 *             whose data we echo back; it reports "push ok" / "ask ok" on control messages
 *
 * error: after opening a pair, print the error the session ended with ({"error", "code"}).
 */

import crypto from 'node:crypto'
import { WebSocket, WebSocketServer } from 'ws'
import { Multiplexer, WebSocketTransport, encodeObject, decodeObject } from 'omnistreams'
import { Session, connect, OmnistreamsError } from '../../../src/polymux/web/omnistreams.js'
import { readAll as npmReadAll, writeWithinCredit as npmWrite } from './omnistreams_npm.mjs'

const t0 = Date.now()
const opts = { mode: null, url: null, timeoutMs: 90000 }
const argv = process.argv.slice(2)
for (let i = 0; i < argv.length; i++) {
	if (argv[i] === '--mode') opts.mode = argv[++i]
	else if (argv[i] === '--url') opts.url = argv[++i]
	else if (argv[i] === '--timeout-ms') opts.timeoutMs = parseInt(argv[++i], 10)
	else {
		process.stderr.write(`webclient_peer: unknown argument ${argv[i]}\n`)
		process.exit(2)
	}
}
if (!['npm', 'polymux', 'error'].includes(opts.mode) || (opts.mode !== 'npm' && !opts.url)) {
	process.stderr.write('usage: node webclient_peer.mjs --mode npm | --mode polymux|error --url URL\n')
	process.exit(2)
}

const log = (...args) => process.stderr.write(`[webclient_peer ${opts.mode}] +${Date.now() - t0}ms ${args.join(' ')}\n`)
const failures = []
const fail = msg => {
	log('FAIL', msg)
	failures.push(msg)
}
const check = (cond, msg) => cond || fail(msg)
const summary = { ok: false, mode: opts.mode }

function finish() {
	summary.ok = failures.length === 0
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
	finish()
})
process.on('unhandledRejection', e => {
	fail(`unhandled rejection: ${e && e.stack ? e.stack : e}`)
	finish()
})

const SIZE = 1 << 20
const MiB = 1 << 20

function pattern(i, size) {
	const buf = Buffer.allocUnsafe(size)
	for (let j = 0; j < size; j++) buf[j] = (j * 31 + i * 7) & 0xff
	return buf
}
const sha256 = buf => crypto.createHash('sha256').update(buf).digest('hex')
const text = bytes => Buffer.from(bytes).toString()

/** Everything `readable` gives, as one Buffer. */
async function readAll(readable) {
	const parts = []
	for await (const chunk of readable) parts.push(Buffer.from(chunk))
	return Buffer.concat(parts)
}

/** Write `buf` through ours in 100,000-byte writes (not a multiple of the chunk size). */
async function writeAll(channel, buf) {
	for (let off = 0; off < buf.length; off += 100000) await channel.write(buf.subarray(off, off + 100000))
}

// -- ours <-> npm -----------------------------------------------------------------------------

/** The npm side: reads our streams and answers, opens its own, cancels one of ours. */
function npmSide(mux, report) {
	report.controls = []
	report.metadata = []
	mux.onControlMessage(message => {
		report.controls.push(text(message))
		mux.sendControlMessage(new Uint8Array(Buffer.from('echo:' + text(message))))
	})
	mux.onConduit((producer, metadata) => {
		const m = decodeObject(metadata)
		report.metadata.push(m)
		if (m.name.startsWith('up/')) {
			const i = parseInt(m.name.slice(3), 10)
			npmReadAll(producer).then(buf => {
				check(buf.equals(pattern(i, SIZE)), `npm got ${buf.length} bytes on ${m.name}, pattern mismatch`)
				const out = mux.createConduit(encodeObject({ name: `ack/${i}`, chunkSize: 65536 }))
				npmWrite(out, Buffer.from(`${buf.length} ${sha256(buf)}`))
			}, e => fail(`npm reading ${m.name}: ${e.message}`))
		} else if (m.name === 'stop-me') {
			let total = 0
			producer.onData(data => {
				total += data.byteLength
				if (total >= 65536) producer.terminate() // TERMINATE_SENDER: our writes must fail
				else producer.request(1)
			})
			producer.request(4)
		} else if (m.name === 'pair-attempt') {
			npmReadAll(producer).catch(() => {}) // npm does not answer pairs
		} else fail(`npm: unexpected stream ${m.name}`)
	})
}

/** Our side of the npm scenario (either role). */
async function oursAgainstNpm(session, mux, report) {
	const started = Date.now()
	const pong = session.receiveControl()
	session.sendControl('ping')
	// npm opens 8 streams to us, within our credit.
	const incoming = []
	for (let i = 0; i < 8; i++) {
		const out = mux.createConduit(encodeObject({ name: `down/${i}`, chunkSize: 65536 }))
		incoming.push(npmWrite(out, pattern(100 + i, SIZE)))
	}
	const acks = new Map()
	const received = new Map()
	const reading = (async () => {
		for (let n = 0; n < 16; n++) {
			const channel = await session.accept()
			const buf = await readAll(channel.readable)
			if (channel.name.startsWith('ack/')) acks.set(channel.name, text(buf))
			else received.set(channel.name, buf)
		}
	})()
	// We open 8 streams to npm, with extra metadata.
	const outgoing = []
	for (let i = 0; i < 8; i++) {
		const channel = session.open(`up/${i}`, { extra: '€ ok' })
		outgoing.push(writeAll(channel, pattern(i, SIZE)).then(() => channel.end()))
	}
	await Promise.all([...outgoing, ...incoming, reading])
	for (let i = 0; i < 8; i++) {
		const want = pattern(i, SIZE)
		check(acks.get(`ack/${i}`) === `${SIZE} ${sha256(want)}`, `ack/${i}: ${acks.get(`ack/${i}`)}`)
		check(received.get(`down/${i}`)?.equals(pattern(100 + i, SIZE)), `down/${i}: pattern mismatch`)
	}
	check(report.metadata.some(m => m.name === 'up/3' && m.chunkSize === 65536 && m.extra === '€ ok'), `metadata seen by npm: ${JSON.stringify(report.metadata[0])}`)
	report.streams_ms = Date.now() - started

	// npm cancels a stream we write: our pending write fails with code 'cancelled'.
	const victim = session.open('stop-me')
	try {
		for (;;) await victim.write(pattern(1, 65536))
	} catch (error) {
		report.cancelled_by_npm = error.code
		check(error instanceof OmnistreamsError && error.code === 'cancelled', `stop-me: ${error}`)
	}
	// We cancel a stream npm writes: npm's writer sees the termination.
	const endless = mux.createConduit(encodeObject({ name: 'endless', chunkSize: 65536 }))
	const npmResult = npmWrite(endless, pattern(2, 65536), { endless: true })
	const channel = await session.accept()
	const reader = channel.readable.getReader()
	await reader.read()
	await reader.cancel('enough')
	report.cancelled_by_us = await npmResult
	check(report.cancelled_by_us === 'terminated', `npm's writer after our cancel: ${report.cancelled_by_us}`)

	// A pair needs a polymux peer: with npm it times out, clearly.
	try {
		await session.openPair('pair-attempt', {}, { timeout: 300 })
		fail('openPair answered by npm?')
	} catch (error) {
		report.pair_error = error.message
		check(error.code === 'timeout' && /no answer within 300 ms/.test(error.message), `openPair: ${error.message}`)
	}
	report.control = text(await pong)
	check(report.control === 'echo:ping', `control answer ${report.control}`)
	check(report.controls.includes('ping'), `npm saw controls ${report.controls}`)
}

/** A WebSocket server on a free port of 127.0.0.1, once it listens. */
function listen() {
	return new Promise(resolve => {
		const wss = new WebSocketServer({ host: '127.0.0.1', port: 0 })
		wss.on('listening', () => resolve(wss))
	})
}

async function npmMode() {
	// 1. ours is the client, npm the server.
	{
		const wss = await listen()
		const report = {}
		const serverMux = new Promise(resolve =>
			wss.on('connection', socket => {
				const mux = new Multiplexer(new WebSocketTransport(socket))
				npmSide(mux, report)
				resolve(mux)
			}),
		)
		const session = await connect(`ws://127.0.0.1:${wss.address().port}/omnistreams`, { WebSocket, numbering: 'legacy' })
		await oursAgainstNpm(session, await serverMux, report)
		await session.close()
		check((await session.closed).error === null, 'ours as client: unclean close')
		wss.close()
		summary.ours_client = report
	}
	// 2. ours is the server, npm the client.
	{
		const wss = await listen()
		const report = {}
		const ours = new Promise(resolve => wss.on('connection', socket => resolve(new Session(socket, { numbering: 'legacy' }))))
		const socket = new WebSocket(`ws://127.0.0.1:${wss.address().port}/`)
		await new Promise(resolve => socket.addEventListener('open', resolve))
		const mux = new Multiplexer(new WebSocketTransport(socket))
		npmSide(mux, report)
		const session = await ours
		await oursAgainstNpm(session, mux, report)
		socket.close()
		const closed = await session.closed
		check(closed.code === 1005 || closed.code === 1000, `ours as server: closed with ${closed.code}`)
		wss.close()
		summary.ours_server = report
	}
}

// -- ours -> polymux --------------------------------------------------------------------------

async function polymuxMode() {
	const session = await connect(opts.url, { WebSocket })
	const controls = []
	const controlWaiters = []
	session.oncontrol = data => {
		const message = text(data)
		controls.push(message)
		for (const w of controlWaiters.splice(0)) w()
	}
	const control = async prefix => {
		for (;;) {
			const found = controls.find(c => c.startsWith(prefix))
			if (found) return found
			await new Promise(resolve => controlWaiters.push(resolve))
		}
	}

	// Channels polymux opens to us: a one-way push, and a pair we echo.
	session.onchannel = async channel => {
		if (channel.name === 'push') {
			const buf = await readAll(channel.readable)
			check(buf.equals(pattern(9, SIZE)), `push: ${buf.length} bytes, pattern mismatch`)
			check(channel.writable === null, 'push must be receive-only')
			summary.push_write_error = await channel.write('x').then(() => 'none', e => e.code)
		} else if (channel.name === 'ask') {
			for await (const chunk of channel.readable) await channel.write(chunk)
			await channel.close()
		} else fail(`unexpected channel ${channel.name}`)
	}

	// 8 echo pairs of 2 MiB at once.
	const started = Date.now()
	await Promise.all(
		Array.from({ length: 8 }, async (_, i) => {
			const channel = await session.openPair(`echo/${i}`)
			const data = pattern(i, 2 * MiB)
			const back = readAll(channel.readable)
			await writeAll(channel, data)
			await channel.end()
			check((await back).equals(data), `echo/${i}: mismatch`)
			await channel.close()
		}),
	)
	summary.echo_ms = Date.now() - started
	summary.echo_mb_s = +((16 * MiB * 2) / 1e6 / (summary.echo_ms / 1000)).toFixed(1)

	// A one-way stream: the answer comes as a control message.
	const sink = session.open('sink')
	check(sink.readable === null, 'an open() stream has no readable')
	await writeAll(sink, pattern(3, SIZE))
	await sink.end()
	summary.sink = await control('sink ')
	check(summary.sink === `sink ${SIZE} ${sha256(pattern(3, SIZE))}`, `sink answer ${summary.sink}`)

	// We stop reading polymux's endless writer.
	const flood = await session.openPair('flood')
	const reader = flood.readable.getReader()
	let got = 0
	while (got < 256 * 1024) got += (await reader.read()).value.length
	await reader.cancel('enough')
	summary.flood = await control('flood ')
	await flood.close()

	// polymux stops reading ours.
	const stopper = await session.openPair('stopper')
	try {
		for (;;) await stopper.write(pattern(4, 65536))
	} catch (error) {
		summary.stopper = `${error.code}: ${error.message}`
	}

	// We cancel our own stream while a write waits for credit: the write fails at once.
	const hold = await session.openPair('hold')
	const waiting = hold.write(new Uint8Array(4 * MiB)) // polymux does not read: credit runs out
	await new Promise(resolve => setTimeout(resolve, 0)) // the write sent what its credit allowed
	check(hold.credit === 0 && hold.sent === MiB, `hold: credit ${hold.credit}, sent ${hold.sent}`)
	hold.cancel('by the test')
	summary.hold = await waiting.then(() => 'resolved', e => `${e.code}: ${e.message}`)
	summary.hold_polymux = await control('hold ')

	session.sendControl('push')
	summary.pushed = await control('push ')
	summary.asked = await control('ask ')
	await session.close()
	summary.closed = await session.closed
}

async function errorMode() {
	const session = await connect(opts.url, { WebSocket })
	session.openPair('victim').catch(() => {})
	const closed = await session.closed
	summary.code = closed.error?.code ?? null
	summary.error = closed.error?.message ?? null
	summary.ws_code = closed.code
}

const modes = { npm: npmMode, polymux: polymuxMode, error: errorMode }
modes[opts.mode]().then(finish, e => {
	fail(`${opts.mode}: ${e && e.stack ? e.stack : e}`)
	finish()
})
