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
 * (Arguments, watchdog, transport, the libp2p adaptor, the stream and data helpers
 * and the behaviours both peers share live in common.mjs.)
 *
 * Stream names: yamux has none.  The OPENING side writes a first line `<name>\n`
 * (UTF-8) on every stream; the responder strips it and reacts by the name:
 *   echo/*       echo every byte; once the remote half-closed and every echoed byte
 *                was written, half-close our side.
 *   halfclose/*  count bytes until the remote half-closes, reply the decimal count,
 *                half-close.
 *   error/*      reset the stream at once (stream.abort(): WindowUpdate|RST).
 *   big/*        read until half-close, reply "<count> <sha256 hex>", half-close.
 *   name/*       reply the name line's name (UTF-8), half-close (as mplex_peer.mjs's
 *                name/*: a name that crossed a bridge comes back as it arrived).
 *   reject/*     reset the stream at once: a yamux server refuses a stream with a RST
 *                (yamux has no other refusal), as mstream_peer.js rejects reject/*.
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

import {
	Libp2pStream,
	SocketMaConn,
	closeAndWait,
	countAndSha256,
	echoAll,
	echoCheck,
	errText,
	failureList,
	finalChecks,
	halfcloseCheck,
	libp2pMux,
	log,
	mibPerS,
	openNamed,
	pattern,
	peer,
	readNameLine,
	runPeer,
	settle,
	startBehaviour,
	startPeer,
	streamOutcome,
	waitClose,
	writeAll,
	writeSummary,
} from './common.mjs'

// ---------------------------------------------------------------- arguments, process guards
const { opts, t0, tag, transport } = startPeer({
	name: 'yamux_peer',
	defaults: { channels: 64, size: 1048576, big: 33554432, timeoutMs: 90000 },
	tag: o => `${o.role === 'listen' ? 'server' : 'client'} ${o.mode}`,
	debugEnv: 'YAMUX_PEER_DEBUG',
})
const role = opts.role === 'listen' ? 'server' : 'client'

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
 * The onData/onEnd/onError contract: CallbackStream in common.mjs.  Here onError also
 * covers a stream that a received GoAway ended before the remote half-closed.  On top of
 * Libp2pStream: data after the remote FIN is counted (lateBytes) instead of delivered,
 * and write() waits on a per-stream high-water mark.
 */
class YStream extends Libp2pStream {
	constructor(s, label) {
		super(s, label)
		this.maxWriteBuffer = 0
		this.lateBytes = 0 // data delivered after the remote FIN (see _data)
		allStreams.push(this)
	}
	_closedEarlyError() {
		return goAwayReceived === 0
			? new Error('stream closed locally by the package because GoAway(0) arrived (nothing is sent for it: no FIN, no RST)')
			: super._closedEarlyError()
	}
	_data(buf) {
		if (this.ended) {
			// A Data frame carrying FIN *and* payload: the package handles the FIN flag
			// first ('end'), then delivers the payload (its async iterator drops it).
			if (this.lateBytes === 0) log(`${this.label}: ${buf.length} bytes delivered AFTER the remote FIN (Data|FIN with payload?)`)
			this.lateBytes += buf.length
			return
		}
		super._data(buf)
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
}

// ---------------------------------------------------------------- muxer setup
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
	// 'outbound' makes the muxer the client (odd ids).  endOnAbort: see SocketMaConn.
	const maConn = new SocketMaConn(sock, { direction: opts.role === 'connect' ? 'outbound' : 'inbound', rxTap, txTap, endOnAbort: true })
	const muxer = factory.createStreamMuxer(maConn)
	// A connection-level failure (protocol error) aborts every stream: mx.fault, except
	// the aborts that follow a received GoAway(code != 0).
	const mx = libp2pMux(muxer, maConn, {
		wrap: (s, label) => new YStream(s, label),
		idOf: s => s.streamId,
		isFault: () => !(mx.goAwayReceived !== null && mx.goAwayReceived !== 0),
	})
	Object.assign(mx, { rxTap, txTap, maConn, goAwayReceived: null, onGoAway: null })
	const origGoAway = muxer.handleGoAway.bind(muxer)
	muxer.handleGoAway = code => {
		log(`GoAway(${code}) received`)
		if (mx.goAwayReceived === null) mx.goAwayReceived = goAwayReceived = code
		origGoAway(code)
		if (mx.onGoAway) mx.onGoAway(code)
	}
	return mx
}

function wireSummary(mx) {
	return { rx: mx.rxTap.s, tx: mx.txTap.s }
}

// ---------------------------------------------------------------- responder
async function runResponder(mx, sock) {
	const { failures, fail } = failureList()
	const handled = { echo: 0, halfclose: 0, error: 0, big: 0, name: 0, reject: 0, unknown: 0 }
	const names = [] // {line, id} in arrival order
	const open = new Set() // behaviours that have not finished their side yet
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

	// The behaviours only this peer has (echo, halfclose, big: common.mjs).
	const resetAtOnce = kind => ({ w, label, name, done }) => {
		handled[kind]++
		w.onError = e => log(`${label}: error after reset (expected): ${errText(e)}`)
		w.reset(name)
		done('reset (WindowUpdate|RST)')
	}
	const special = {
		error: resetAtOnce('error'),
		reject: resetAtOnce('reject'),
		name: ({ name, replyAndEnd }) => {
			handled.name++
			replyAndEnd(name)
			return { onData: () => {}, onEnd: () => {} }
		},
	}

	// The name is the first line of the stream's data.
	mx.onStream(w => {
		open.add(w)
		readNameLine(
			w,
			(name, firstData) => {
				const label = `${w.label} ${JSON.stringify(name)}`
				names.push({ line: name, id: w.id })
				startBehaviour(w, name, firstData, {
					label,
					handled,
					special,
					done: what => {
						finish(w)
						log(`${label}: ${what}`)
					},
					unexpected: e => {
						finish(w)
						fail(`${label}: stream failed: ${errText(e)}`)
					},
				})
			},
			finish,
			fail
		)
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
	finalChecks(mx, fail)
	const unfinished = [...open].map(w => w.label)
	if (unfinished.length) log(`streams not finished when the connection ended: ${unfinished.join(', ')}`)
	const summary = {
		ok: failures.length === 0,
		mode: 'responder',
		role,
		transport,
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
	writeSummary(summary)
	return summary.ok
}

// ---------------------------------------------------------------- driver
async function runDriver(mx, sock) {
	const { failures, fail } = failureList()
	const result = {
		ok: false,
		mode: 'driver',
		role,
		transport,
		channels: opts.channels,
		size: opts.size,
		big: opts.big,
	}
	// Every stream starts with its name line.
	const open = name => openNamed(mx, name, true)

	async function errorStream() {
		const { w, received } = await open('error/x')
		const out = await streamOutcome(received, { outcome: null, error_name: null, message: null, status: null, bytes: 0 })
		out.status = w.s.status
		log(`error: ${JSON.stringify(out)}`)
		if (out.outcome !== 'error') throw new Error(`error/: expected the stream to be reset, got ${JSON.stringify(out)}`)
		return out
	}

	async function bigStream() {
		const data = pattern(99, opts.big)
		const expected = countAndSha256(data)
		const t = Date.now()
		const { w, received } = await open('big/x')
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
			mib_per_s: mibPerS(data.length, ms),
			max_write_buffer: w.maxWriteBuffer,
		}
	}

	async function ping() {
		const t = Date.now()
		const rtt = await mx.muxer.ping()
		return { rtt_ms: rtt, wall_ms: Date.now() - t }
	}

	const [echoRes, hcRes, errRes, bigRes, pingRes] = await Promise.all([
		echoAll(opts.channels, i => echoCheck(open, i, opts.size).then(({ w, bytes }) => ({ bytes, id: w.id })), fail),
		settle('halfclose', halfcloseCheck(open), fail),
		settle('error', errorStream(), fail),
		settle('big', bigStream(), fail),
		settle('ping', ping(), fail),
	])
	// One more ping once everything is quiet.
	const pingIdle = await settle('ping (idle)', ping(), fail)

	result.echo_ok = echoRes.r.filter(x => x.ok).length
	result.echo_ms = echoRes.ms
	result.echo_mib_per_s = mibPerS(2 * opts.channels * opts.size, echoRes.ms)
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
	if (peer.fatalCount) fail(`${peer.fatalCount} handler exception(s)`)

	await closeAndWait(mx, sock) // FIN on open streams (none left), GoAway(0)
	await new Promise(r => setTimeout(r, 10))
	result.goaway_sent = mx.txTap.s.goaway.map(g => g.code)
	result.wire = wireSummary(mx)
	result.elapsed_ms = Date.now() - t0
	result.ok = failures.length === 0
	result.failures = failures
	writeSummary(result)
	return result.ok
}

// ---------------------------------------------------------------- main
runPeer(async sock => {
	const mx = await setupYamux(sock)
	log(`yamux muxer ready (${mx.muxer.client ? 'client, odd ids' : 'server, even ids'})`)
	return opts.mode === 'responder' ? await runResponder(mx, sock) : await runDriver(mx, sock)
})
