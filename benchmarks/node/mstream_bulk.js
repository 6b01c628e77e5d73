#!/usr/bin/env node
'use strict'
/*
 * Node-to-Node bulk transfer over npm `nerdbank-streams` (MultiplexingStream), the
 * reference for polymux's mstream-v1/v2/v3 bulk rows (benchmarks/node_ref.py).
 *
 *   node mstream_bulk.js --listen --version V          prints `LISTENING <port>`, accepts one
 *                                                      connection and channel "bulk", counts
 *                                                      bytes until the end, replies the count
 *   node mstream_bulk.js --connect PORT --version V --size BYTES
 *                                                      offers "bulk", writes BYTES in 64 KiB
 *                                                      writes (with backpressure), ends, waits
 *                                                      for the count; prints {"ms":..,"bytes":..}
 *
 * The package is loaded from tests/interop/node/node_modules (scripts/setup --with-node).
 */
const path = require('path')
const net = require('net')
const { createRequire } = require('module')
const nodeDir = path.resolve(__dirname, '..', '..', 'tests', 'interop', 'node')
const { MultiplexingStream } = createRequire(path.join(nodeDir, 'package.json'))('nerdbank-streams')

const argv = process.argv.slice(2)
const arg = name => {
	const i = argv.indexOf(name)
	return i < 0 ? null : argv[i + 1]
}
const version = parseInt(arg('--version') || '3', 10)
const watchdog = setTimeout(() => {
	process.stderr.write('mstream_bulk: watchdog\n')
	process.exit(3)
}, parseInt(arg('--timeout-ms') || '600000', 10))
watchdog.unref()

async function listen() {
	const server = net.createServer(async sock => {
		server.close()
		const mx = await MultiplexingStream.CreateAsync(sock, { protocolMajorVersion: version })
		const ch = await mx.acceptChannelAsync('bulk')
		const s = ch.stream
		let n = 0
		s.on('data', c => (n += c.length))
		s.on('end', () => {
			s.end(String(n), () => {
				setTimeout(() => {
					mx.dispose()
					sock.destroy()
				}, 50)
			})
		})
	})
	server.listen(0, '127.0.0.1', () => process.stdout.write(`LISTENING ${server.address().port}\n`))
}

async function connect() {
	const size = parseInt(arg('--size'), 10)
	const sock = net.connect(parseInt(arg('--connect'), 10), '127.0.0.1')
	await new Promise((res, rej) => sock.once('connect', res).once('error', rej))
	const mx = await MultiplexingStream.CreateAsync(sock, { protocolMajorVersion: version })
	const ch = await mx.offerChannelAsync('bulk')
	const s = ch.stream
	const data = Buffer.alloc(size, 7)
	const reply = new Promise((resolve, reject) => {
		const parts = []
		s.on('data', c => parts.push(c))
		s.on('end', () => resolve(Buffer.concat(parts).toString()))
		s.on('error', reject)
	})
	const t0 = process.hrtime.bigint()
	for (let off = 0; off < size; off += 65536) {
		if (!s.write(data.subarray(off, Math.min(off + 65536, size)))) {
			await new Promise(r => s.once('drain', r))
		}
	}
	s.end()
	const got = await reply
	const ms = Number(process.hrtime.bigint() - t0) / 1e6
	process.stdout.write(JSON.stringify({ ok: got === String(size), ms, bytes: size, reply: got }) + '\n')
	mx.dispose()
	sock.destroy()
	process.exit(got === String(size) ? 0 : 1)
}

;(arg('--connect') ? connect() : listen()).catch(e => {
	process.stderr.write(`mstream_bulk: ${e && e.stack ? e.stack : e}\n`)
	process.exit(1)
})
