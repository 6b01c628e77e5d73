#!/usr/bin/env node
/*
 * Interop test peer for polymux: drives npm `@chainsafe/libp2p-yamux` over a real TCP
 * or unix socket.
 *
 *   node yamux_peer.mjs --listen|--connect --tcp PORT|--unix PATH --mode responder|driver
 *        [--channels N=64] [--size BYTES=1048576] [--big BYTES=33554432] [--timeout-ms MS=90000]
 *
 *   @chainsafe/libp2p-yamux 8.0.1 (with @libp2p/utils 7.4.1, @libp2p/interface 3.3.0)
 *   over a small net.Socket adaptor (exact versions pinned in package.json /
 *   package-lock.json).  Package defaults are kept (256 KiB initial window, windows
 *   grow up to 16 MiB, keep-alive ping every 30 s, max 1000 inbound / 1000 outbound
 *   streams) except maxReadBufferLength (256 MiB, see below) and maxEarlyStreams.
 *
 * --listen listens on 127.0.0.1 (--tcp 0 = any free port) or on the unix path and
 * prints `LISTENING <port|path>` once listening, accepts ONE connection, runs the
 * mode, exits.  --connect connects.  Roles: the connecting side is the yamux client
 * (maConn.direction 'outbound': odd stream ids 1,3,5...), the listening side the
 * server ('inbound': even ids 2,4,6...).
 *
 * stdout: `LISTENING ...` (listen only), then one JSON summary line ({"ok":...}).
 *         Everything else goes to stderr (YAMUX_PEER_DEBUG=1: libp2p's log;
 *         YAMUX_PEER_TAP=1: every frame header sent/received).
 *         The summary has a "wire" object: counts of frames seen on the socket in
 *         each direction (decoded by a tap independent of the package), pings with
 *         their opaque values, GoAway codes, window-update deltas, largest data frame.
 * exit:   0 success, 1 a check failed / unexpected error, 2 bad usage, 3 watchdog.
 *
 * Stream names: yamux has none.  The OPENING side writes a first line `<name>\n`
 * (UTF-8) on every stream; the responder strips it and reacts by the name:
 *   echo/*       echo every byte; once the remote half-closed and every echoed byte
 *                was written, half-close our side.
 *   halfclose/*  count bytes until the remote half-closes, reply the decimal count,
 *                half-close.
 *   error/*      reset the stream at once (stream.abort(): WindowUpdate|RST).
 *   big/*        read until half-close, reply "<count> <sha256 hex>", half-close.
 *   (other)      reset the stream (logged, not a failure).
 *
 * Responder: serves until the connection ends, or until a GoAway arrived and every
 * stream is done (then it ends the socket), then exits 0 if nothing failed.
 *
 * Driver (this peer opens streams; all run at the same time):
 *   --channels `echo/<i>` streams of --size bytes each, byte j = (j*31 + i*7) & 0xff,
 *   written in 64 KiB pieces with backpressure, half-closed, echo compared;
 *   `halfclose/x` 300000 bytes -> "300000"; `error/x` must end with a reset (how it
 *   surfaces is recorded); `big/x` --big bytes (pattern i=99) in 64 KiB writes ->
 *   "<count> <sha256>", MiB/s recorded; muxer.ping() RTT recorded.  Then
 *   muxer.close() (FIN on any open stream, then GoAway(0)), end the socket.
 *
 * What @chainsafe/libp2p-yamux 8.0.1 does on the wire (read from the installed
 * dist/src/{muxer,stream,decode,config,errors}.js and @libp2p/utils 7.4.1
 * abstract-*.js, and checked with this peer's tap and raw-frame probes):
 *   - Open: createStream() sends WindowUpdate|SYN with delta 0 (in a microtask),
 *     then plain Data frames; it never waits for the ACK.  Data|SYN from the peer
 *     (payload included) is accepted as well.  A configured initialStreamWindowSize
 *     > 256 KiB is NOT announced (the SYN delta stays 0) yet is also assumed as the
 *     remote's window: not configured here.
 *   - ACK: lazy, on the first frame it sends for an inbound stream: normally the
 *     WindowUpdate|ACK right after the first received Data frame (delta = its
 *     length), or its first Data / FIN.  A bare SYN gets no ACK until then; RST
 *     never carries ACK (an inbound stream reset at once is never ACKed).
 *   - Windows: 256 KiB per stream initially, no session window.  After every
 *     received non-empty Data frame it sends a WindowUpdate with delta = bytes
 *     received since the last update: credit on ARRIVAL, no half-window threshold,
 *     unless the application paused the stream (no updates while paused; resume()
 *     sends the accumulated delta).  Auto-tuning: if the previous update went out
 *     at most 4*RTT ms ago (RTT from its own ping, integer ms, often 0-1 on
 *     loopback; never before the first pong) the window doubles, up to 16 MiB, and
 *     the growth is added to the delta (probe: 12, 65536 x3, ..., then 327680,
 *     589824, 1114112, 2162688, 4259840, 8454144 = window 16 MiB).
 *   - Send: one Data frame per min(send window, queued bytes), cut at (send window
 *     after the last update - 12): frames up to ~16 MiB when the peer grants that
 *     (the selftest saw 4194292).  The config maxMessageSize (64 KiB) is unused.
 *   - FIN: WindowUpdate|FIN, delta 0 (|SYN or |ACK if still pending).  RST:
 *     WindowUpdate|RST, delta 0.  A received RST -> StreamResetError "The stream has
 *     been reset", nothing sent back.  Both FINs -> the stream is forgotten.
 *     A received Data|FIN WITH payload: the FIN is handled before the payload
 *     ('end' first, then 'message'; its async iterator loses the payload): send FIN
 *     on a separate empty frame.  After a local reset of an inbound stream it can
 *     still send one WindowUpdate (delta = bytes of the frame that triggered it).
 *   - Ping: SYN ping opaque 0 right at start, then 1, 2, ... 30 s after each answer
 *     (muxer.ping() joins the outstanding one); no timeout: an unanswered ping stays
 *     outstanding and no further keep-alive ping is sent.  Answers Ping|SYN with Ping|ACK, same opaque.  Ping|ACK
 *     with no ping outstanding (UnRequestedPingError) or another opaque
 *     (NotMatchingPingError), or a ping whose flags are not exactly SYN or ACK:
 *     protocol error.
 *   - Protocol errors (also version != 0, type > 3, Data/WindowUpdate on id 0,
 *     Ping/GoAway on id != 0, Data beyond the receive window): RST on every open
 *     stream, GoAway(1), then maConn.abort() closes the connection (this adaptor
 *     end()s the socket so those frames get out; @libp2p/tcp destroys it).
 *   - SYN with the wrong id parity ("Both endpoints are clients", an error without
 *     .reason): RSTs, GoAway(0) (!), socket closed.  SYN for an id already open:
 *     ignored, the frame applies to the existing stream.
 *   - GoAway: muxer.close() half-closes (FIN) every open stream, then sends
 *     GoAway(0); it neither waits for the peer's FINs nor closes the socket.
 *     Received GoAway(0): every open stream is closed locally at once and SILENTLY
 *     (no FIN/RST, queued data dropped, later frames for them ignored), nothing is
 *     sent back, pings are still answered and a NEW inbound SYN is still accepted.
 *     Received GoAway(code != 0): RST on every open stream, then GoAway(0) back;
 *     the socket stays open.  (This peer, as responder, ends the socket once a
 *     GoAway arrived and its streams are done.)
 *   - Ids: client odd from 1, server even from 2, +2, never reused.
 *   - Limits: the 1001st concurrently open inbound stream (maxInboundStreams 1000)
 *     gets WindowUpdate|RST and its frames are ignored; after its own GoAway every
 *     new SYN gets RST.  Frames for unknown ids without SYN (Data, WindowUpdate,
 *     FIN, RST) are dropped silently, no RST.
 */

import fs from 'node:fs'
import net from 'node:net'
import crypto from 'node:crypto'

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

// ---------------------------------------------------------------- arguments
function usage(msg) {
	if (msg) process.stderr.write(`yamux_peer: ${msg}\n`)
	process.stderr.write(
		'usage: node yamux_peer.mjs --listen|--connect --tcp PORT|--unix PATH ' +
			'--mode responder|driver [--channels N] [--size BYTES] [--big BYTES] [--timeout-ms MS]\n'
	)
	process.exit(2)
}

function parseArgs(argv) {
	const o = { role: null, tcp: null, unix: null, mode: null, channels: 64, size: 1048576, big: 33554432, timeoutMs: 90000 }
	const intArg = (name, v) => {
		if (v === undefined || !/^\d+$/.test(v)) usage(`${name} needs a non-negative integer`)
		return parseInt(v, 10)
	}
	for (let i = 0; i < argv.length; i++) {
		const a = argv[i]
		switch (a) {
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
	if (!o.role) usage('one of --listen/--connect is required')
	if ((o.tcp === null) === (o.unix === null)) usage('exactly one of --tcp/--unix is required')
	if (!['responder', 'driver'].includes(o.mode)) usage('--mode must be responder or driver')
	return o
}

const opts = parseArgs(process.argv.slice(2))
const t0 = Date.now()
const tag = `[yamux_peer ${opts.role === 'listen' ? 'server' : 'client'} ${opts.mode}]`
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

// ---------------------------------------------------------------- wire tap
/*
 * Decodes yamux frame headers from the raw byte stream of one direction, independently
 * of the package, for the summary (and for stderr with YAMUX_PEER_TAP=1).
 */
const TYPES = ['Data', 'WindowUpdate', 'Ping', 'GoAway']
const tapPrint = process.env.YAMUX_PEER_TAP === '1'
function flagText(f) {
	const n = []
	if (f & 1) n.push('SYN')
	if (f & 2) n.push('ACK')
	if (f & 4) n.push('FIN')
	if (f & 8) n.push('RST')
	if (f & ~15) n.push(`0x${(f & ~15).toString(16)}`)
	return n.join('|')
}
class FrameTap {
	constructor(dir) {
		this.dir = dir
		this.hdr = Buffer.alloc(12)
		this.have = 0
		this.skip = 0 // data payload bytes still to skip
		this.s = {
			frames: 0,
			bytes: 0,
			kinds: {}, // "Type+FLAGS" -> count
			data_bytes: 0,
			data_frame_max: 0,
			empty_data_frames: 0,
			wu_count: 0,
			wu_delta_max: 0,
			wu_delta_hist: {}, // power-of-two bucket "<=N" -> count (non-zero deltas)
			syn_wu_deltas: {}, // delta carried by WindowUpdate|SYN -> count
			syn_ids: { first: null, last: null, odd: 0, even: 0 },
			pings: [], // {flag, opaque, t_ms} (first 20)
			ping_count: { SYN: 0, ACK: 0, other: 0 },
			goaway: [], // {code, t_ms}
			bad: 0, // version != 0 or unknown type
		}
	}
	feed(buf) {
		const s = this.s
		s.bytes += buf.length
		let off = 0
		while (off < buf.length) {
			if (this.skip > 0) {
				const k = Math.min(this.skip, buf.length - off)
				this.skip -= k
				off += k
				continue
			}
			const k = Math.min(12 - this.have, buf.length - off)
			buf.copy(this.hdr, this.have, off, off + k)
			this.have += k
			off += k
			if (this.have < 12) break
			this.have = 0
			this.frame(this.hdr)
		}
	}
	frame(h) {
		const s = this.s
		const ver = h[0]
		const type = h[1]
		const flags = h.readUInt16BE(2)
		const id = h.readUInt32BE(4)
		const len = h.readUInt32BE(8)
		s.frames++
		const tname = TYPES[type] ?? `type${type}`
		if (ver !== 0 || type > 3) s.bad++
		const key = flags ? `${tname}+${flagText(flags)}` : tname
		s.kinds[key] = (s.kinds[key] || 0) + 1
		if (tapPrint) process.stderr.write(`${tag} TAP ${this.dir} ${tname} flags=${flagText(flags) || '0'} id=${id} len=${len}\n`)
		if (flags & 1 && (type === 0 || type === 1)) {
			if (s.syn_ids.first === null) s.syn_ids.first = id
			s.syn_ids.last = id
			if (id % 2) s.syn_ids.odd++
			else s.syn_ids.even++
		}
		switch (type) {
			case 0:
				s.data_bytes += len
				if (len > s.data_frame_max) s.data_frame_max = len
				if (len === 0) s.empty_data_frames++
				this.skip = len
				break
			case 1:
				s.wu_count++
				if (len > s.wu_delta_max) s.wu_delta_max = len
				if (len > 0) {
					let b = 1
					while (b < len) b *= 2
					s.wu_delta_hist[`<=${b}`] = (s.wu_delta_hist[`<=${b}`] || 0) + 1
				}
				if (flags & 1) s.syn_wu_deltas[len] = (s.syn_wu_deltas[len] || 0) + 1
				break
			case 2: {
				const f = flags === 1 ? 'SYN' : flags === 2 ? 'ACK' : 'other'
				s.ping_count[f]++
				if (s.pings.length < 20) s.pings.push({ flag: flagText(flags), opaque: len, t_ms: Date.now() - t0 })
				break
			}
			case 3:
				s.goaway.push({ code: len, t_ms: Date.now() - t0 })
				break
		}
	}
}

// ---------------------------------------------------------------- stream wrapper
const WRITE_HIGH = 256 * 1024 // bytes queued on one stream before write() waits
const allStreams = [] // every YStream, for the late-data check
let goAwayReceived = null // code of the first GoAway received
function lateDataFailures() {
	return allStreams
		.filter(w => w.lateBytes > 0)
		.map(w => `${w.label}: ${w.lateBytes} bytes arrived after the remote FIN (a Data frame with FIN and payload: the package ends the stream before delivering the payload, its async iterator loses it; send FIN on a separate empty frame)`)
}
/*
 * The package's listeners are attached in the constructor (libp2p buffers data with no
 * 'message' listener, and aborts the stream past maxReadBufferLength); the application
 * sets onData/onEnd/onError synchronously right after construction.
 *   onData(buf)   bytes from the remote
 *   onEnd()       the remote half-closed and all its data was delivered
 *   onError(err)  the stream failed: remote reset, local abort, or the connection (or a
 *                 received GoAway) ended it before the remote half-closed.  Called at
 *                 most once, never after onEnd.
 */
class YStream {
	constructor(s, label) {
		this.s = s
		this.label = label
		this.id = s.streamId
		this.onData = () => {}
		this.onEnd = () => {}
		this.onError = () => {}
		this.ended = false
		this.failed = false
		this.localReset = false
		this.maxWriteBuffer = 0
		this.lateBytes = 0 // data delivered after the remote FIN (see _data)
		allStreams.push(this)
		let remoteClosed = false
		s.addEventListener('message', e => this._data(Buffer.from(e.data.subarray())))
		s.addEventListener('remoteCloseWrite', () => {
			remoteClosed = true
		})
		// 'end' also fires on reset/abort/transport close (before 'close'): only a real
		// remote FIN counts as end of data.
		s.addEventListener('end', () => {
			if (remoteClosed && s.status !== 'reset' && s.status !== 'aborted') this._end()
		})
		s.addEventListener('close', e => {
			if (e.error) this._error(e.error)
			// (remote FIN seen but data still buffered while paused: 'end' follows on resume)
			else if (!this.ended && !remoteClosed) {
				this._error(
					new Error(
						goAwayReceived === 0
							? 'stream closed locally by the package because GoAway(0) arrived (nothing is sent for it: no FIN, no RST)'
							: `stream closed before the remote half-closed (status ${s.status})`
					)
				)
			}
		})
	}
	_data(buf) {
		if (this.ended) {
			// A Data frame carrying FIN *and* payload: the package handles the FIN flag
			// first ('end'), then delivers the payload (its async iterator drops it).
			if (this.lateBytes === 0) log(`${this.label}: ${buf.length} bytes delivered AFTER the remote FIN (Data|FIN with payload?)`)
			this.lateBytes += buf.length
			return
		}
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
	/**
	 * Resolves once the stream can take more.  send() returns false when the send
	 * window is used up or the socket is saturated, and the package then emits 'drain'
	 * on a window update or a socket drain.  A socket drain wakes EVERY stream, even
	 * one whose window is still 0, so a writer that just waits for 'drain' keeps piling
	 * data into the stream's write buffer (it grew to the whole 1 MiB echo payload);
	 * so we also wait while more than WRITE_HIGH bytes are queued on the stream.
	 * (stream.onDrain() is not used: in @libp2p/utils 7.4.1 its promise is never
	 * renewed after the first drain, so it stops applying backpressure.)
	 */
	async write(buf) {
		const ok = this.s.send(buf)
		let wait = !ok
		while (wait || this.s.writeBufferLength > WRITE_HIGH) {
			if (this.s.writeBufferLength > this.maxWriteBuffer) this.maxWriteBuffer = this.s.writeBufferLength
			wait = false
			await this._nextWriteEvent()
			// let the package's queued processSendQueue() run before looking again
			await new Promise(r => setImmediate(r))
		}
		if (this.s.writeBufferLength > this.maxWriteBuffer) this.maxWriteBuffer = this.s.writeBufferLength
	}
	_nextWriteEvent() {
		if (this.s.writeStatus === 'closed') return Promise.reject(new Error(`stream not writable (status ${this.s.status})`))
		return new Promise((resolve, reject) => {
			const done = e => {
				this.s.removeEventListener('drain', onDrain)
				this.s.removeEventListener('idle', onDrain)
				this.s.removeEventListener('close', onClose)
				e ? reject(e) : resolve()
			}
			const onDrain = () => done()
			const onClose = e => done(e.error || new Error('stream closed while waiting for drain'))
			this.s.addEventListener('drain', onDrain)
			this.s.addEventListener('idle', onDrain)
			this.s.addEventListener('close', onClose)
		})
	}
	/** Half-close: FIN after all queued data. */
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
function makeLibp2pLogger(name) {
	const enabled = process.env.YAMUX_PEER_DEBUG === '1'
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
 * 'drain' and 'close' events, send(Uint8ArrayList | Uint8Array) -> boolean, abort(err), close(), log,
 * and `direction` ('outbound' makes the yamux muxer a client: odd ids).
 * (What @libp2p/tcp's unexported socket-to-conn does, minus multiaddrs and metrics.)
 */
class SocketMaConn extends EventTarget {
	constructor(sock, direction, rxTap, txTap) {
		super()
		this.sock = sock
		this.direction = direction
		this.rxTap = rxTap
		this.txTap = txTap
		this.log = makeLibp2pLogger('maconn')
		this.status = 'open'
		this.aborted = null
		sock.on('data', buf => {
			rxTap.feed(buf)
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
	send(data) {
		if (this.sock.destroyed || this.sock.writableEnded) return false
		// yamux passes a Uint8ArrayList for Data frames (header + payload) and a bare
		// Uint8Array (the 12-byte header) for the other frame types.
		const list = data instanceof Uint8Array ? [data] : data
		let ok = true
		this.sock.cork()
		for (const b of list) {
			this.txTap.feed(Buffer.from(b.buffer, b.byteOffset, b.byteLength))
			ok = this.sock.write(b)
		}
		this.sock.uncork()
		return ok
	}
	abort(err) {
		this.aborted = err
		log(`connection aborted by the muxer: ${errText(err)}`)
		// end() rather than destroy(): lets the RST/GoAway frames just queued reach the peer.
		this.sock.end()
		setTimeout(() => this.sock.destroy(), 500).unref()
	}
	async close() {
		this.sock.end()
	}
}

async function setupYamux(sock) {
	const { yamux } = await import('@chainsafe/libp2p-yamux')
	const rxTap = new FrameTap('rx')
	const txTap = new FrameTap('tx')
	const factory = yamux({
		maxEarlyStreams: 1_000_000, // inbound streams before the 'stream' listener (attached at once anyway)
		// maxInboundStreams / maxOutboundStreams stay at the default 1000 (enough for 64+).
		streamOptions: {
			// Default 4 MiB: a paused stream (echo backpressure) keeps receiving up to its
			// (grown, <= 16 MiB) window, and past this limit the package aborts the stream.
			maxReadBufferLength: 256 << 20,
		},
	})()
	const maConn = new SocketMaConn(sock, opts.role === 'connect' ? 'outbound' : 'inbound', rxTap, txTap)
	const muxer = factory.createStreamMuxer(maConn)
	const mx = {
		fault: null,
		muxer,
		rxTap,
		txTap,
		maConn,
		goAwayReceived: null,
		onGoAway: null,
		onStream(cb) {
			muxer.addEventListener('stream', evt => {
				const s = evt.detail
				cb(new YStream(s, `stream ${s.streamId}`))
			})
		},
		async open(name) {
			const s = await muxer.createStream()
			return new YStream(s, `stream ${s.streamId} ${JSON.stringify(name)}`)
		},
		async close() {
			await muxer.close().catch(e => log(`muxer.close: ${errText(e)}`))
			await maConn.close()
		},
	}
	// A connection-level failure (protocol error) aborts every stream.
	const origAbort = muxer.abort.bind(muxer)
	muxer.abort = err => {
		if (muxer.status !== 'closed' && !(mx.goAwayReceived !== null && mx.goAwayReceived !== 0)) {
			mx.fault = err
			log(`muxer aborted: ${errText(err)}`)
		}
		origAbort(err)
	}
	const origGoAway = muxer.handleGoAway.bind(muxer)
	muxer.handleGoAway = code => {
		log(`GoAway(${code}) received`)
		if (mx.goAwayReceived === null) mx.goAwayReceived = goAwayReceived = code
		origGoAway(code)
		if (mx.onGoAway) mx.onGoAway(code)
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

function wireSummary(mx) {
	return { rx: mx.rxTap.s, tx: mx.txTap.s }
}

// ---------------------------------------------------------------- responder
async function runResponder(mx, sock) {
	const failures = []
	const handled = { echo: 0, halfclose: 0, error: 0, big: 0, unknown: 0 }
	const names = [] // {line, id} in arrival order
	const open = new Set() // behaviours that have not finished their side yet
	const fail = msg => {
		failures.push(msg)
		log(`FAIL: ${msg}`)
	}
	let goAwayDone = null // resolves when a GoAway arrived and every stream is done
	const allDone = new Promise(r => (goAwayDone = r))
	const checkGoAwayDone = () => {
		if (mx.goAwayReceived !== null && open.size === 0) goAwayDone()
	}
	const finish = w => {
		open.delete(w)
		checkGoAwayDone()
	}
	mx.onGoAway = () => setTimeout(checkGoAwayDone, 0) // after the package closed its streams

	function startBehaviour(w, name, firstData) {
		const label = `${w.label} ${JSON.stringify(name)}`
		const slash = name.indexOf('/')
		const kind = slash >= 0 ? name.slice(0, slash) : name
		names.push({ line: name, id: w.id })
		log(`${label}: ${kind}`)
		const done = what => {
			finish(w)
			log(`${label}: ${what}`)
		}
		const unexpected = e => {
			finish(w)
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
					// Stop reading this stream (= stop granting window) while our writes wait.
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
				w.onError = e => log(`${label}: error after reset (expected): ${errText(e)}`)
				w.reset(name)
				done('reset (WindowUpdate|RST)')
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
		// The name is the first line of the stream's data.
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
					finish(w)
					fail(`${w.label}: no newline in the first ${n} bytes`)
				}
				return
			}
			startBehaviour(w, buf.subarray(0, nl).toString('utf8'), buf.subarray(nl + 1))
		}
		w.onEnd = () => {
			finish(w)
			fail(`${w.label}: remote half-closed before sending a name line (${n} bytes)`)
		}
		w.onError = e => {
			finish(w)
			fail(`${w.label}: stream failed before its name line: ${errText(e)}`)
		}
	})

	const how = await Promise.race([waitClose(sock, 1e9).then(() => 'connection closed'), allDone.then(() => 'GoAway received and all streams done')])
	log(how)
	if (how !== 'connection closed') {
		sock.end()
		if (!(await waitClose(sock, 2000))) {
			log('remote did not close within 2 s; destroying socket')
			sock.destroy()
		}
	}
	await new Promise(r => setTimeout(r, 10)) // let close events run
	for (const f of lateDataFailures()) fail(f)
	if (mx.fault) fail(`connection fault: ${errText(mx.fault)}`)
	if (fatalCount) fail(`${fatalCount} handler exception(s)`)
	const unfinished = [...open].map(w => w.label)
	if (unfinished.length) log(`streams not finished when the connection ended: ${unfinished.join(', ')}`)
	const summary = {
		ok: failures.length === 0,
		mode: 'responder',
		role: opts.role === 'listen' ? 'server' : 'client',
		transport: opts.unix !== null ? 'unix' : 'tcp',
		ended_by: how,
		handled,
		names,
		unfinished,
		remote_pings: mx.rxTap.s.ping_count.SYN,
		remote_goaway: mx.goAwayReceived,
		rtt_ms: mx.muxer.getRTT(),
		failures,
		wire: wireSummary(mx),
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
		role: opts.role === 'listen' ? 'server' : 'client',
		transport: opts.unix !== null ? 'unix' : 'tcp',
		channels: opts.channels,
		size: opts.size,
		big: opts.big,
	}

	/** Opens a stream, attaches the collector at once, writes the name line. */
	async function openNamed(name) {
		const w = await mx.open(name)
		const received = collect(w)
		received.catch(() => {})
		await w.write(Buffer.from(name + '\n', 'utf8'))
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
		return { bytes: got.length, id: w.id }
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
		const { w, received } = await openNamed('error/x')
		const out = { outcome: null, error_name: null, message: null, status: null, bytes: 0 }
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
		out.status = w.s.status
		log(`error: ${JSON.stringify(out)}`)
		if (out.outcome !== 'error') throw new Error(`error/: expected the stream to be reset, got ${JSON.stringify(out)}`)
		return out
	}

	async function bigStream() {
		const data = pattern(99, opts.big)
		const expected = `${data.length} ${crypto.createHash('sha256').update(data).digest('hex')}`
		const t = Date.now()
		const { w, received } = await openNamed('big/x')
		await writeAll(w, data)
		const tSent = Date.now()
		await w.end()
		const reply = (await received).toString('utf8')
		const ms = Date.now() - t
		if (reply !== expected) throw new Error(`big reply ${JSON.stringify(reply)} !== ${JSON.stringify(expected)}`)
		return {
			reply,
			ms,
			write_ms: tSent - t,
			mib_per_s: +(data.length / 1048576 / (Math.max(1, ms) / 1000)).toFixed(2),
			max_write_buffer: w.maxWriteBuffer,
		}
	}

	async function ping() {
		const t = Date.now()
		const rtt = await mx.muxer.ping()
		return { rtt_ms: rtt, wall_ms: Date.now() - t }
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
	const [echoRes, hcRes, errRes, bigRes, pingRes] = await Promise.all([
		echoAll,
		named('halfclose', halfcloseStream()),
		named('error', errorStream()),
		named('big', bigStream()),
		named('ping', ping()),
	])
	// One more ping once everything is quiet.
	const pingIdle = await named('ping (idle)', ping())

	result.echo_ok = echoRes.r.filter(x => x.ok).length
	result.echo_ms = echoRes.ms
	result.echo_mib_per_s = +((2 * opts.channels * opts.size) / 1048576 / (Math.max(1, echoRes.ms) / 1000)).toFixed(2)
	result.stream_ids = echoRes.r.filter(x => x.ok).slice(0, 4).map(x => x.v.id)
	result.halfclose_reply = hcRes.v
	result.error_stream = errRes.v
	result.big = bigRes.v
	result.big_mib_per_s = bigRes.v ? bigRes.v.mib_per_s : null
	result.ping = pingRes.v
	result.ping_idle = pingIdle.v
	result.remote_pings = mx.rxTap.s.ping_count.SYN
	result.remote_goaway = mx.goAwayReceived
	for (const f of lateDataFailures()) fail(f)
	if (mx.fault) fail(`connection fault: ${errText(mx.fault)}`)
	if (mx.goAwayReceived !== null) fail(`remote sent GoAway(${mx.goAwayReceived}) before the driver finished`)
	if (fatalCount) fail(`${fatalCount} handler exception(s)`)

	await mx.close() // FIN on open streams (none left), GoAway(0)
	if (!(await waitClose(sock, 2000))) {
		log('remote did not close within 2 s; destroying socket')
		sock.destroy()
	}
	await new Promise(r => setTimeout(r, 10))
	result.goaway_sent = mx.txTap.s.goaway.map(g => g.code)
	result.wire = wireSummary(mx)
	result.elapsed_ms = Date.now() - t0
	result.ok = failures.length === 0
	result.failures = failures
	process.stdout.write(JSON.stringify(result) + '\n')
	return result.ok
}

// ---------------------------------------------------------------- main
async function main() {
	const sock = await getSocket()
	sock.setNoDelay && sock.setNoDelay(true)
	sock.on('error', e => log(`socket error: ${errText(e)}`))
	const mx = await setupYamux(sock)
	log(`yamux muxer ready (${mx.muxer.client ? 'client, odd ids' : 'server, even ids'})`)
	const ok = opts.mode === 'responder' ? await runResponder(mx, sock) : await runDriver(mx, sock)
	exit(ok ? 0 : 1, ok ? 'success' : 'FAILED')
}

main().catch(e => exit(1, `fatal: ${e && e.stack ? e.stack : errText(e)}`))
