#!/usr/bin/env node
/*
 * Interop test peer for polymux: drives the two npm implementations of the
 * mplex / multiplex wire format over a real TCP or unix socket.
 *
 *   node mplex_peer.mjs --impl multiplex|libp2p --listen|--connect --tcp PORT|--unix PATH
 *        --mode responder|driver [--channels N=32] [--size BYTES=1048576]
 *        [--big BYTES=5242880] [--timeout-ms MS=60000]
 *
 *   --impl multiplex  npm `multiplex` 6.7.0 (maxogden), created with {halfOpen: true}
 *   --impl libp2p     npm `@libp2p/mplex` 12.0.32 (with @libp2p/utils 7.4.1,
 *                     @libp2p/interface 3.3.0) over a small net.Socket adaptor
 *   (exact versions pinned in package.json / package-lock.json)
 *
 * --listen listens on 127.0.0.1 (--tcp 0 = any free port) or on the unix path and
 * prints `LISTENING <port|path>` once listening, accepts ONE connection, runs the
 * mode, exits.  --connect connects.  For mplex neither side of the connection is
 * special: each side numbers its own streams from 0 and the Initiator/Receiver flag
 * says whose stream a frame belongs to (libp2p 12 has no client/server option for
 * mplex; the connecting side is the "initiator" only in name).
 *
 * stdout: `LISTENING ...` (listen only), then one JSON summary line ({"ok":...}).
 *         Everything else goes to stderr (set MPLEX_PEER_DEBUG=1 for libp2p's log).
 * exit:   0 success, 1 a check failed / unexpected error, 2 bad usage, 3 watchdog.
 *
 * Stream behaviours (the driver opens, the responder reacts):
 *   echo/*       echo every byte; once the remote half-closed and every echoed byte
 *                was written, half-close our side.
 *   name/*       reply the stream name as this implementation exposes it, then
 *                half-close (multiplex: the NewStream name; libp2p: stream.id, "r<id>").
 *   halfclose/*  count bytes until the remote half-closes, reply the decimal count,
 *                half-close.
 *   error/<msg>  reset the stream with Error(<msg>) (multiplex: stream.destroy(err),
 *                which puts <msg> in the reset frame; libp2p: stream.abort(err),
 *                whose reset frame is always empty).
 *   big/*        read until half-close, reply "<count> <sha256 hex>", half-close.
 *   (other)      reset the stream (logged, not a failure).
 *
 * How the responder learns the behaviour name:
 *   multiplex: from the NewStream body (the 'stream' event passes channel.name:
 *              the body decoded as UTF-8, or the id in decimal if the body is empty).
 *   libp2p:    @libp2p/mplex drops the NewStream body (it is only used in trace logs);
 *              an inbound stream exposes only id "r<id>" and protocol "".  So in libp2p
 *              mode every stream starts with a line `<name>\n` (UTF-8) in its data: the
 *              driver writes it first, and the responder strips it before applying the
 *              behaviour.  The `name/*` reply is then stream.id (e.g. "r37").
 *
 * Driver (this peer opens streams; the remote responder implements the same list):
 *   --channels concurrent `echo/<i>` streams of --size bytes each, byte j =
 *   (j*31 + i*7) & 0xff, written in 64 KiB pieces with backpressure, half-closed,
 *   echo compared; `name/héllo wörld/✓` (multiplex: must come back verbatim; libp2p:
 *   the reply is only recorded); `halfclose/x` 300000 bytes -> "300000";
 *   `error/boom from python` must fail (multiplex: with message "boom from python";
 *   libp2p: any reset, its message is recorded); `big/x` ONE write of --big bytes
 *   (pattern i=99) -> "<count> <sha256>".  All run at the same time.
 *
 * What these two implementations do on the wire (read from the installed sources
 * multiplex/index.js and @libp2p/mplex/dist/src/*.js, @libp2p/utils abstract-*.js):
 *
 *   Framing (both): uvarint header (id << 3 | flag), uvarint length, body.  Both
 *   compute `id << 3` / `header >> 3` in 32-bit JS ints: ids must stay < 2^28.
 *
 *   multiplex 6.7.0
 *   - NewStream (0): body = name as UTF-8; an EMPTY body when the name equals the
 *     id in decimal (createStream() without a name).  Received: empty body -> name
 *     is the id's decimal string.  A NewStream for an id already in use replaces
 *     the old stream silently (its later finalize frees the slot of the new one).
 *   - Ids: lowest free local index, from 0, REUSED once a stream is finalized
 *     (our Close sent and the remote's Close received+read, or reset either way).
 *   - Data: the opener sends MessageInitiator (2), the acceptor MessageReceiver (1).
 *     Each write() becomes exactly one frame, never split, no size limit (opts.limit
 *     unset: receive size unlimited too).  A 5 MiB write = one 5 MiB frame.  A
 *     zero-length data frame is accepted and delivers nothing.
 *   - Close: end() sends CloseInitiator (4) / CloseReceiver (3), empty body, after
 *     all queued data.  It is a half-close: with {halfOpen: true} receiving Close
 *     only ends our readable side (without halfOpen, 6.7.0 would end()
 *     its own side as soon as the remote's Close is read).
 *   - Reset: destroy(err) sends ResetInitiator (6) / ResetReceiver (5) with body =
 *     err.message as UTF-8 (empty for destroy() without an error).  On receipt the
 *     stream errors with Error(body as UTF-8, or "Channel destroyed" if empty);
 *     nothing is sent back.
 *   - Unknown id (data/close/reset for a stream it does not have): silently ignored.
 *     Odd flags (1,3,5) are looked up among its own streams, even flags among the
 *     remote's.
 *   - No flow control: a slow reader stops reading the whole socket (HOL blocking).
 *   - End of the connection: every stream is closed without error.
 *
 *   @libp2p/mplex 12.0.32
 *   - NewStream (0): body = ASCII "i<id>" always (e.g. "i0"); names are not
 *     configurable and a received body is ignored.  Inbound streams are called
 *     "r<id>", outbound "i<id>".
 *   - Ids: a counter from 0 per connection, never reused.
 *   - Data: MessageInitiator (2) from the opener, MessageReceiver (1) from the
 *     acceptor.  Sends are split into frames of at most 1,048,576 bytes
 *     (maxMessageSize); a received frame whose length is > 1,048,576 throws and the
 *     whole connection is aborted (socket destroyed).
 *   - Close: close() sends CloseInitiator (4) / CloseReceiver (3), empty body,
 *     after queued data: half-close.  Receiving Close only ends the readable side;
 *     the stream is forgotten once both sides closed.
 *   - Reset: abort(err) sends ResetInitiator (6) / ResetReceiver (5) with an EMPTY
 *     body (the error text is never sent).  A received reset body is ignored and
 *     surfaces as StreamResetError "The stream has been reset"; nothing is sent back.
 *   - Unknown id: ignored, but each one counts against disconnectThreshold, and so
 *     does every NewStream (separate counters, fixed 1 s windows, default 5: the 6th
 *     in a window aborts the muxer = Reset sent on every open stream, no new local
 *     streams; the libp2p connection layer would then close the socket).  This peer
 *     raises it to 1e6.  NewStream for an id already open creates a second stream
 *     with the same id (frames go to the first one).
 *   - Frame boundaries do not follow write boundaries: whatever is queued on a stream
 *     when the socket accepts data goes out in one frame, cut at 1 MiB (the big test
 *     shows 6 frames: the name line, then 5 x 1,048,576).
 *   - A header with flag 7 stalls the decoder for good (treated as incomplete).
 *   - No flow control on the wire: pause() just buffers (maxReadBufferLength, raised
 *     here to 256 MiB; default 4 MiB, then the stream is reset).
 */

import fs from 'node:fs'
import net from 'node:net'
import crypto from 'node:crypto'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)

// The libp2p packages call Promise.withResolvers() (Node >= 22).
if (typeof Promise.withResolvers !== 'function') {
	Promise.withResolvers = function withResolvers() {
		let resolve, reject
		const promise = new Promise((res, rej) => {
			resolve = res
			reject = rej
		})
		return { promise, resolve, reject }
	}
}
// multiplex 6.7.0 uses `new Buffer(...)`; keep stderr readable.
process.noDeprecation = true

// ---------------------------------------------------------------- arguments
function usage(msg) {
	if (msg) process.stderr.write(`mplex_peer: ${msg}\n`)
	process.stderr.write(
		'usage: node mplex_peer.mjs --impl multiplex|libp2p --listen|--connect --tcp PORT|--unix PATH ' +
			'--mode responder|driver [--channels N] [--size BYTES] [--big BYTES] [--timeout-ms MS]\n'
	)
	process.exit(2)
}

function parseArgs(argv) {
	const o = { impl: null, role: null, tcp: null, unix: null, mode: null, channels: 32, size: 1048576, big: 5242880, timeoutMs: 60000 }
	const intArg = (name, v) => {
		if (v === undefined || !/^\d+$/.test(v)) usage(`${name} needs a non-negative integer`)
		return parseInt(v, 10)
	}
	for (let i = 0; i < argv.length; i++) {
		const a = argv[i]
		switch (a) {
			case '--impl':
				o.impl = argv[++i]
				break
			case '--listen':
			case '--connect':
				o.role = a.slice(2)
				break
			case '--tcp':
				o.tcp = intArg(a, argv[++i])
				break
			case '--unix':
				o.unix = argv[++i]
				if (!o.unix) usage('--unix needs a path')
				break
			case '--mode':
				o.mode = argv[++i]
				break
			case '--channels':
				o.channels = intArg(a, argv[++i])
				break
			case '--size':
				o.size = intArg(a, argv[++i])
				break
			case '--big':
				o.big = intArg(a, argv[++i])
				break
			case '--timeout-ms':
				o.timeoutMs = intArg(a, argv[++i])
				break
			case '-h':
			case '--help':
				usage()
				break
			default:
				usage(`unknown argument ${a}`)
		}
	}
	if (!['multiplex', 'libp2p'].includes(o.impl)) usage('--impl must be multiplex or libp2p')
	if (!o.role) usage('one of --listen/--connect is required')
	if ((o.tcp === null) === (o.unix === null)) usage('exactly one of --tcp/--unix is required')
	if (!['responder', 'driver'].includes(o.mode)) usage('--mode must be responder or driver')
	return o
}

const opts = parseArgs(process.argv.slice(2))
const t0 = Date.now()
const tag = `[mplex_peer ${opts.impl} ${opts.mode}]`
function log(...args) {
	process.stderr.write(`${tag} +${Date.now() - t0}ms ${args.join(' ')}\n`)
}
function errText(e) {
	if (e === null || e === undefined) return String(e)
	if (e instanceof Error) return `${e.name}: ${e.message}`
	return String(e)
}

// ---------------------------------------------------------------- process guards
let unixPathToRemove = null
function cleanup() {
	if (unixPathToRemove) {
		try {
			fs.unlinkSync(unixPathToRemove)
		} catch (_) {
			/* already gone */
		}
		unixPathToRemove = null
	}
}

let exiting = false
function exit(code, msg) {
	if (exiting) return
	exiting = true
	if (msg) log(msg)
	cleanup()
	process.exitCode = code
	// Give stdout/stderr a moment to flush when they are pipes.
	setTimeout(() => process.exit(code), 20).unref()
}

const watchdog = setTimeout(() => {
	process.stderr.write(`${tag} TIMEOUT: watchdog fired after ${opts.timeoutMs} ms\n`)
	cleanup()
	process.exit(3)
}, opts.timeoutMs)
watchdog.unref()

let fatalCount = 0
process.on('unhandledRejection', e => log(`unhandled rejection (ignored): ${errText(e)}`))
process.on('uncaughtException', e => {
	fatalCount++
	log(`uncaught exception: ${e && e.stack ? e.stack : errText(e)}`)
	exit(1)
})

// ---------------------------------------------------------------- transport
function getSocket() {
	return new Promise((resolve, reject) => {
		if (opts.role === 'listen') {
			const server = net.createServer()
			server.once('error', reject)
			server.once('connection', sock => {
				server.close() // ONE connection only
				log('accepted connection')
				resolve(sock)
			})
			const onListening = () => {
				const where = opts.unix !== null ? opts.unix : server.address().port
				process.stdout.write(`LISTENING ${where}\n`)
			}
			if (opts.unix !== null) {
				try {
					if (fs.statSync(opts.unix).isSocket()) fs.unlinkSync(opts.unix)
				} catch (_) {
					/* does not exist */
				}
				unixPathToRemove = opts.unix
				server.listen(opts.unix, onListening)
			} else {
				server.listen(opts.tcp, '127.0.0.1', onListening)
			}
		} else {
			const sock = opts.unix !== null ? net.createConnection(opts.unix) : net.createConnection(opts.tcp, '127.0.0.1')
			sock.once('error', reject)
			sock.once('connect', () => {
				sock.removeListener('error', reject)
				log('connected')
				resolve(sock)
			})
		}
	})
}

function waitClose(sock, ms) {
	return new Promise(resolve => {
		if (sock.destroyed) return resolve(true)
		const t = setTimeout(() => resolve(false), ms)
		sock.once('close', () => {
			clearTimeout(t)
			resolve(true)
		})
	})
}

// ---------------------------------------------------------------- uniform stream wrapper
/*
 * MuxStream hides the two stream APIs.  The implementation's listeners are attached in
 * the constructor (libp2p buffers data with no 'message' listener, and aborts the stream
 * past maxReadBufferLength); the application sets onData/onEnd/onError synchronously
 * right after construction, before any event can be delivered.
 *   onData(buf)   bytes from the remote
 *   onEnd()       the remote half-closed and all its data was delivered
 *   onError(err)  the stream failed: remote reset, local abort, or the connection ended
 *                 before the remote half-closed.  Called at most once, never after onEnd.
 */
class MuxStream {
	constructor(kind, label) {
		this.kind = kind
		this.label = label
		this.onData = () => {}
		this.onEnd = () => {}
		this.onError = () => {}
		this.ended = false
		this.failed = false
		this.localReset = false
	}
	_data(buf) {
		if (this.failed) return
		try {
			this.onData(buf)
		} catch (e) {
			log(`${this.label}: onData threw: ${e && e.stack ? e.stack : errText(e)}`)
			fatalCount++
		}
	}
	_end() {
		if (this.ended || this.failed) return
		this.ended = true
		try {
			this.onEnd()
		} catch (e) {
			log(`${this.label}: onEnd threw: ${e && e.stack ? e.stack : errText(e)}`)
			fatalCount++
		}
	}
	_error(err) {
		if (this.failed || this.localReset) return
		this.failed = true
		try {
			this.onError(err)
		} catch (e) {
			log(`${this.label}: onError threw: ${e && e.stack ? e.stack : errText(e)}`)
			fatalCount++
		}
	}
}

class MultiplexStream extends MuxStream {
	constructor(ch, label) {
		super('multiplex', label)
		this.ch = ch
		this.name = ch.name
		this.id = ch.channel
		ch.on('data', b => this._data(b))
		ch.on('end', () => this._end())
		ch.on('error', e => this._error(e))
		// _clear() at the end of the connection destroys channels without an error.
		ch.on('close', () => {
			if (!this.ended) this._error(new Error('stream closed before the remote half-closed'))
		})
	}
	/** Resolves when the data was accepted, after 'drain' if write() said so. */
	write(buf) {
		if (this.ch.write(buf)) return Promise.resolve()
		return new Promise((resolve, reject) => {
			const done = e => {
				this.ch.removeListener('drain', onDrain)
				this.ch.removeListener('close', onClose)
				e ? reject(e) : resolve()
			}
			const onDrain = () => done()
			const onClose = () => done(new Error('stream closed while waiting for drain'))
			this.ch.once('drain', onDrain)
			this.ch.once('close', onClose)
		})
	}
	/** Half-close: Close frame after all data; resolves on 'finish'. */
	end() {
		return new Promise((resolve, reject) => {
			const onClose = () => reject(new Error('stream closed before end() finished'))
			this.ch.once('close', onClose)
			this.ch.end(() => {
				this.ch.removeListener('close', onClose)
				resolve()
			})
		})
	}
	pause() {
		this.ch.pause()
	}
	resume() {
		this.ch.resume()
	}
	reset(msg) {
		this.localReset = true
		this.ch.destroy(msg === undefined ? undefined : new Error(msg))
	}
}

class Libp2pStream extends MuxStream {
	constructor(s, label) {
		super('libp2p', label)
		this.s = s
		this.name = s.id // "i<id>" outbound, "r<id>" inbound
		this.id = s.streamId
		let remoteClosed = false
		s.addEventListener('message', e => this._data(Buffer.from(e.data.subarray())))
		s.addEventListener('remoteCloseWrite', () => {
			remoteClosed = true
		})
		// 'end' also fires on reset/abort/transport close (before 'close'): only a real
		// remote Close counts as end of data.
		s.addEventListener('end', () => {
			if (remoteClosed && s.status !== 'reset' && s.status !== 'aborted') this._end()
		})
		s.addEventListener('close', e => {
			if (e.error) this._error(e.error)
			// (remote Close seen but data still buffered while paused: 'end' follows on resume)
			else if (!this.ended && !remoteClosed) this._error(new Error(`stream closed before the remote half-closed (status ${s.status})`))
		})
	}
	async write(buf) {
		if (!this.s.send(buf)) await this.s.onDrain()
	}
	async end() {
		await this.s.close()
	}
	pause() {
		this.s.pause()
	}
	resume() {
		this.s.resume()
	}
	reset(msg) {
		this.localReset = true
		this.s.abort(new Error(msg === undefined ? 'reset' : msg))
	}
}

// ---------------------------------------------------------------- muxer setup
/*
 * Both return { open(name) -> Promise<MuxStream>, onStream(cb(MuxStream)), close(),
 *               fault: null | Error (connection-level failure) }.
 */
function setupMultiplex(sock) {
	const multiplex = require('multiplex')
	const mx = {
		fault: null,
		streamCb: null,
		onStream(cb) {
			this.streamCb = cb
		},
		async open(name) {
			const ch = plex.createStream(name)
			return new MultiplexStream(ch, `stream ${ch.channel} ${JSON.stringify(name)}`)
		},
		async close() {
			plex.end() // destroys remaining channels, then ends the socket (pipe)
		},
	}
	const plex = multiplex({ halfOpen: true }, (ch, name) => {
		const w = new MultiplexStream(ch, `stream ${ch.channel} ${JSON.stringify(name)}`)
		if (mx.streamCb) mx.streamCb(w)
		else w.reset('no handler')
	})
	plex.on('error', e => {
		mx.fault = e
		log(`multiplex error: ${errText(e)}`)
	})
	sock.pipe(plex).pipe(sock)
	return mx
}

function makeLibp2pLogger(name) {
	const enabled = process.env.MPLEX_PEER_DEBUG === '1'
	const out = (level, fmt, ...args) => {
		if (!enabled) return
		process.stderr.write(`${tag} libp2p ${level} ${name}: ${fmt} ${args.map(a => (a instanceof Error ? errText(a) : typeof a === 'object' ? JSON.stringify(a) : String(a))).join(' ')}\n`)
	}
	const f = (fmt, ...args) => out('log', fmt, ...args)
	f.enabled = enabled
	f.trace = (fmt, ...args) => out('trace', fmt, ...args)
	f.error = (fmt, ...args) => out('error', fmt, ...args)
	f.newScope = scope => makeLibp2pLogger(`${name}:${scope}`)
	return f
}

/**
 * The MultiaddrConnection the muxer needs: an EventTarget with 'message' (evt.data),
 * 'drain' and 'close' events, send(Uint8ArrayList) -> boolean, abort(err), close(), log.
 * (What @libp2p/tcp's unexported socket-to-conn does, minus multiaddrs and metrics.)
 */
class SocketMaConn extends EventTarget {
	constructor(sock) {
		super()
		this.sock = sock
		this.log = makeLibp2pLogger('maconn')
		this.status = 'open'
		sock.on('data', buf => {
			const e = new Event('message')
			e.data = buf
			this.dispatchEvent(e)
		})
		sock.on('drain', () => this.dispatchEvent(new Event('drain')))
		sock.on('close', () => {
			this.status = 'closed'
			this.dispatchEvent(new Event('close'))
		})
	}
	send(list) {
		if (this.sock.destroyed || this.sock.writableEnded) return false
		let ok = true
		this.sock.cork()
		for (const b of list) ok = this.sock.write(b)
		this.sock.uncork()
		return ok
	}
	abort(err) {
		log(`connection aborted by the muxer: ${errText(err)}`)
		this.sock.destroy()
	}
	async close() {
		this.sock.end()
	}
}

async function setupLibp2p(sock) {
	const { mplex } = await import('@libp2p/mplex')
	const big = 1_000_000
	const factory = mplex({
		disconnectThreshold: big, // new streams / unknown-stream frames per second before disconnect
		maxUnprocessedMessageQueueSize: 16 << 20,
		maxEarlyStreams: big,
		maxInboundStreams: big, // declared in @libp2p/interface 3.x, not enforced by 12.x
		maxOutboundStreams: big,
		streamOptions: { maxReadBufferLength: 256 << 20 },
		// maxMessageSize stays at its default 1 MiB: it is the wire limit both ways.
	})()
	const maConn = new SocketMaConn(sock)
	const muxer = factory.createStreamMuxer(maConn)
	const mx = {
		fault: null,
		muxer,
		onStream(cb) {
			muxer.addEventListener('stream', evt => {
				const s = evt.detail
				cb(new Libp2pStream(s, `stream ${s.id}`))
			})
		},
		async open(name) {
			const s = await muxer.createStream()
			return new Libp2pStream(s, `stream ${s.id} ${JSON.stringify(name)}`)
		},
		async close() {
			await muxer.close().catch(e => log(`muxer.close: ${errText(e)}`))
			await maConn.close()
		},
	}
	// A connection-level failure (decode error, rate limit) aborts every stream.
	const origAbort = muxer.abort.bind(muxer)
	muxer.abort = err => {
		if (muxer.status !== 'closed') {
			mx.fault = err
			log(`muxer aborted: ${errText(err)}`)
		}
		origAbort(err)
	}
	return mx
}

// ---------------------------------------------------------------- data helpers
function pattern(i, size) {
	const b = Buffer.allocUnsafe(size)
	const base = (i * 7) & 0xff
	for (let j = 0; j < size; j++) b[j] = (j * 31 + base) & 0xff
	return b
}

function firstDiff(a, b) {
	const n = Math.min(a.length, b.length)
	for (let k = 0; k < n; k++) if (a[k] !== b[k]) return k
	return a.length === b.length ? -1 : n
}

async function writeAll(w, buf, chunkSize = 65536) {
	for (let off = 0; off < buf.length; off += chunkSize) {
		await w.write(buf.subarray(off, Math.min(off + chunkSize, buf.length)))
	}
}

/** Promise of all bytes until the remote half-closes; rejects if the stream fails. */
function collect(w) {
	const chunks = []
	let n = 0
	return new Promise((resolve, reject) => {
		w.onData = c => {
			chunks.push(c)
			n += c.length
		}
		w.onEnd = () => resolve(Buffer.concat(chunks, n))
		w.onError = e => {
			e.partial = Buffer.concat(chunks, n)
			reject(e)
		}
	})
}

// ---------------------------------------------------------------- responder
async function runResponder(mx, sock) {
	const failures = []
	const handled = { echo: 0, name: 0, halfclose: 0, error: 0, big: 0, unknown: 0 }
	const names = [] // what arrived, for the summary
	const open = new Set() // behaviours that have not finished their side yet
	const fail = msg => {
		failures.push(msg)
		log(`FAIL: ${msg}`)
	}

	function startBehaviour(w, name, firstData) {
		const label = opts.impl === 'libp2p' ? `${w.label} ${JSON.stringify(name)}` : w.label
		const slash = name.indexOf('/')
		const kind = slash >= 0 ? name.slice(0, slash) : name
		names.push(opts.impl === 'libp2p' ? { line: name, id: w.name } : name)
		log(`${label}: ${kind}`)
		const done = what => {
			open.delete(w)
			log(`${label}: ${what}`)
		}
		const unexpected = e => {
			open.delete(w)
			fail(`${label}: stream failed: ${errText(e)}`)
		}
		const replyAndEnd = text =>
			w
				.write(Buffer.from(text, 'utf8'))
				.then(() => w.end())
				.then(
					() => done(`replied ${JSON.stringify(text.length > 80 ? text.slice(0, 80) + '...' : text)} and half-closed`),
					unexpected
				)
		let onData
		let onEnd
		switch (kind) {
			case 'echo': {
				handled.echo++
				let bytes = 0
				let chain = Promise.resolve()
				let pending = 0
				let paused = false
				onData = chunk => {
					bytes += chunk.length
					pending++
					chain = chain.then(() => w.write(chunk)).finally(() => {
						pending--
						if (paused && pending === 0 && !w.failed) {
							paused = false
							try {
								w.resume()
							} catch (e) {
								log(`${label}: resume: ${errText(e)}`)
							}
						}
					})
					chain.catch(() => {})
					// Stop reading this stream while our writes wait for the transport.
					if (pending > 4 && !paused && !w.ended) {
						paused = true
						try {
							w.pause()
						} catch (_) {
							paused = false
						}
					}
				}
				onEnd = () => {
					log(`${label}: remote half-closed after ${bytes} bytes`)
					chain.then(() => w.end()).then(() => done(`echoed ${bytes} bytes and half-closed`), unexpected)
				}
				break
			}
			case 'name': {
				handled.name++
				onData = () => {}
				onEnd = () => {}
				replyAndEnd(w.name)
				break
			}
			case 'halfclose': {
				handled.halfclose++
				let bytes = 0
				onData = c => (bytes += c.length)
				onEnd = () => replyAndEnd(String(bytes))
				break
			}
			case 'big': {
				handled.big++
				let bytes = 0
				const h = crypto.createHash('sha256')
				onData = c => {
					bytes += c.length
					h.update(c)
				}
				onEnd = () => replyAndEnd(`${bytes} ${h.digest('hex')}`)
				break
			}
			case 'error': {
				handled.error++
				const msg = name.slice(slash + 1)
				w.onError = e => log(`${label}: error after reset (expected): ${errText(e)}`)
				w.reset(msg)
				done(`reset with Error(${JSON.stringify(msg)})`)
				return
			}
			default: {
				handled.unknown++
				w.reset(`unknown behaviour ${name}`)
				done('unknown behaviour: reset')
				return
			}
		}
		w.onData = onData
		w.onEnd = onEnd
		w.onError = unexpected
		if (firstData && firstData.length) onData(firstData)
	}

	mx.onStream(w => {
		open.add(w)
		if (opts.impl === 'multiplex') {
			startBehaviour(w, String(w.name), null)
			return
		}
		// libp2p: the name is the first line of the stream's data.
		const parts = []
		let n = 0
		w.onData = c => {
			parts.push(c)
			n += c.length
			const buf = Buffer.concat(parts, n)
			const nl = buf.indexOf(0x0a)
			if (nl < 0) {
				if (n > 65536) {
					w.reset('no name line')
					open.delete(w)
					fail(`${w.label}: no newline in the first ${n} bytes`)
				}
				return
			}
			startBehaviour(w, buf.subarray(0, nl).toString('utf8'), buf.subarray(nl + 1))
		}
		w.onEnd = () => {
			open.delete(w)
			fail(`${w.label}: remote half-closed before sending a name line (${n} bytes)`)
		}
		w.onError = e => {
			open.delete(w)
			fail(`${w.label}: stream failed before its name line: ${errText(e)}`)
		}
	})

	await waitClose(sock, 1e9)
	log('connection closed')
	await new Promise(r => setTimeout(r, 10)) // let close events run
	if (mx.fault) fail(`connection fault: ${errText(mx.fault)}`)
	if (fatalCount) fail(`${fatalCount} handler exception(s)`)
	const unfinished = [...open].map(w => w.label)
	if (unfinished.length) log(`streams not finished when the connection ended: ${unfinished.join(', ')}`)
	const summary = {
		ok: failures.length === 0,
		mode: 'responder',
		impl: opts.impl,
		transport: opts.unix !== null ? 'unix' : 'tcp',
		handled,
		names,
		unfinished,
		failures,
		elapsed_ms: Date.now() - t0,
	}
	process.stdout.write(JSON.stringify(summary) + '\n')
	return summary.ok
}

// ---------------------------------------------------------------- driver
async function runDriver(mx, sock) {
	const failures = []
	const fail = msg => {
		failures.push(msg)
		log(`FAIL: ${msg}`)
	}
	const result = {
		ok: false,
		mode: 'driver',
		impl: opts.impl,
		transport: opts.unix !== null ? 'unix' : 'tcp',
		channels: opts.channels,
		size: opts.size,
		big: opts.big,
	}
	const libp2p = opts.impl === 'libp2p'

	/** Opens a stream, attaches the collector at once, writes the name line in libp2p mode. */
	async function openNamed(name) {
		const w = await mx.open(name)
		const received = collect(w)
		received.catch(() => {})
		if (libp2p) await w.write(Buffer.from(name + '\n', 'utf8'))
		return { w, received }
	}

	async function echoStream(i) {
		const name = `echo/${i}`
		const data = pattern(i, opts.size)
		const { w, received } = await openNamed(name)
		await writeAll(w, data)
		await w.end()
		const got = await received
		const d = firstDiff(data, got)
		if (d !== -1) throw new Error(`${name}: echo mismatch: sent ${data.length} got ${got.length} bytes, first difference at offset ${d}`)
		return got.length
	}

	async function nameStream() {
		const name = 'name/héllo wörld/✓'
		const { w, received } = await openNamed(name)
		await w.end()
		const reply = (await received).toString('utf8')
		const out = { sent: name, sent_as: libp2p ? w.name : name, reply, carried: reply === name }
		log(`name: ${JSON.stringify(out)}`)
		if (!libp2p && reply !== name) throw new Error(`name reply mismatch: ${JSON.stringify(reply)} !== ${JSON.stringify(name)}`)
		return out
	}

	async function halfcloseStream() {
		const { w, received } = await openNamed('halfclose/x')
		await writeAll(w, pattern(99, 300000))
		await w.end()
		const got = (await received).toString('utf8')
		if (got !== '300000') throw new Error(`halfclose reply ${JSON.stringify(got)} !== "300000"`)
		return got
	}

	async function errorStream() {
		const name = 'error/boom from python'
		const { w, received } = await openNamed(name)
		const out = { outcome: null, error_name: null, message: null, bytes: 0 }
		try {
			const got = await received
			out.outcome = 'ended'
			out.bytes = got.length
		} catch (e) {
			out.outcome = 'error'
			out.error_name = e && e.name
			out.message = e && e.message
			out.bytes = e && e.partial ? e.partial.length : 0
		}
		log(`error: ${JSON.stringify(out)}`)
		if (out.outcome !== 'error') throw new Error(`error/: expected the stream to fail, got ${JSON.stringify(out)}`)
		if (!libp2p && out.message !== 'boom from python') {
			throw new Error(`error/: multiplex should surface the reset text "boom from python", got ${JSON.stringify(out)}`)
		}
		return out
	}

	async function bigStream() {
		const t = Date.now()
		const data = pattern(99, opts.big)
		const expected = `${data.length} ${crypto.createHash('sha256').update(data).digest('hex')}`
		const { w, received } = await openNamed('big/x')
		await w.write(data) // ONE write
		await w.end()
		const reply = (await received).toString('utf8')
		if (reply !== expected) throw new Error(`big reply ${JSON.stringify(reply)} !== ${JSON.stringify(expected)}`)
		return { reply, ms: Date.now() - t }
	}

	const named = (label, p) =>
		p.then(
			v => ({ ok: true, v }),
			e => {
				fail(`${label}: ${errText(e)}`)
				return { ok: false, v: null }
			}
		)

	const tEcho = Date.now()
	const echoes = []
	for (let i = 0; i < opts.channels; i++) echoes.push(named(`echo/${i}`, echoStream(i)))
	const echoAll = Promise.all(echoes).then(r => ({ r, ms: Date.now() - tEcho }))
	const [echoRes, nameRes, hcRes, errRes, bigRes] = await Promise.all([
		echoAll,
		named('name', nameStream()),
		named('halfclose', halfcloseStream()),
		named('error', errorStream()),
		named('big', bigStream()),
	])

	result.echo_ok = echoRes.r.filter(x => x.ok).length
	result.echo_ms = echoRes.ms
	result.echo_mib_per_s = +((2 * opts.channels * opts.size) / 1048576 / (Math.max(1, echoRes.ms) / 1000)).toFixed(2)
	result.name = nameRes.v
	result.halfclose_reply = hcRes.v
	result.error_stream = errRes.v
	result.big = bigRes.v
	if (mx.fault) fail(`connection fault: ${errText(mx.fault)}`)
	if (fatalCount) fail(`${fatalCount} handler exception(s)`)
	result.elapsed_ms = Date.now() - t0
	result.ok = failures.length === 0
	result.failures = failures
	process.stdout.write(JSON.stringify(result) + '\n')

	await mx.close()
	if (!(await waitClose(sock, 2000))) {
		log('remote did not close within 2 s; destroying socket')
		sock.destroy()
	}
	return result.ok
}

// ---------------------------------------------------------------- main
async function main() {
	const sock = await getSocket()
	sock.setNoDelay && sock.setNoDelay(true)
	sock.on('error', e => log(`socket error: ${errText(e)}`))
	const mx = opts.impl === 'multiplex' ? setupMultiplex(sock) : await setupLibp2p(sock)
	log(`${opts.impl} muxer ready`)
	const ok = opts.mode === 'responder' ? await runResponder(mx, sock) : await runDriver(mx, sock)
	exit(ok ? 0 : 1, ok ? 'success' : 'FAILED')
}

main().catch(e => exit(1, `fatal: ${e && e.stack ? e.stack : errText(e)}`))
