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
 * (Arguments, watchdog, transport, the libp2p adaptor, the stream and data helpers
 * and the behaviours both peers share live in common.mjs.)
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

import { createRequire } from 'node:module'
import {
	CallbackStream,
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
	readNameLine,
	runPeer,
	settle,
	startBehaviour,
	startPeer,
	streamOutcome,
	waitClose,
	writeSummary,
} from './common.mjs'

const require = createRequire(import.meta.url)

// multiplex 6.7.0 uses `new Buffer(...)`; keep stderr readable.
process.noDeprecation = true

// ---------------------------------------------------------------- arguments, process guards
const { opts, t0, transport } = startPeer({
	name: 'mplex_peer',
	usage: '--impl multiplex|libp2p ',
	defaults: { channels: 32, size: 1048576, big: 5242880, timeoutMs: 60000 },
	stringFlags: { '--impl': 'impl' },
	check: (o, usage) => {
		if (!['multiplex', 'libp2p'].includes(o.impl)) usage('--impl must be multiplex or libp2p')
	},
	tag: o => `${o.impl} ${o.mode}`,
	debugEnv: 'MPLEX_PEER_DEBUG',
})

// ---------------------------------------------------------------- stream wrappers
/* (The onData/onEnd/onError contract: CallbackStream in common.mjs.) */
class MultiplexStream extends CallbackStream {
	constructor(ch, label) {
		super(label)
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

class MplexStream extends Libp2pStream {
	constructor(s, label) {
		super(s, label)
		this.name = s.id // "i<id>" outbound, "r<id>" inbound
	}
	/**
	 * Waits for stream.onDrain() when send() said so.  (yamux_peer.mjs needs more, a
	 * per-stream high-water mark: yamux send windows leave data queued on a stream that
	 * a socket drain wakes anyway.  mplex has no windows and sends whatever is queued
	 * as the socket accepts it, so this simple wait is kept as it was.)
	 */
	async write(buf) {
		if (!this.s.send(buf)) await this.s.onDrain()
	}
}

// ---------------------------------------------------------------- muxer setup
/*
 * Both return { open(name) -> Promise<stream>, onStream(cb(stream)), close(),
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
	// No direction (@libp2p/mplex does not read it), no taps, destroy() on abort.
	const maConn = new SocketMaConn(sock)
	const muxer = factory.createStreamMuxer(maConn)
	// A connection-level failure (decode error, rate limit) aborts every stream: mx.fault.
	return libp2pMux(muxer, maConn, { wrap: (s, label) => new MplexStream(s, label), idOf: s => s.id })
}

// ---------------------------------------------------------------- responder
async function runResponder(mx, sock) {
	const { failures, fail } = failureList()
	const handled = { echo: 0, name: 0, halfclose: 0, error: 0, big: 0, unknown: 0 }
	const names = [] // what arrived, for the summary
	const open = new Set() // behaviours that have not finished their side yet
	const finish = w => open.delete(w)

	// The behaviours only this peer has (echo, halfclose, big: common.mjs).
	const special = {
		name: ({ w, replyAndEnd }) => {
			handled.name++
			replyAndEnd(w.name)
			return { onData: () => {}, onEnd: () => {} }
		},
		error: ({ w, label, rest: msg, done }) => {
			handled.error++
			w.onError = e => log(`${label}: error after reset (expected): ${errText(e)}`)
			w.reset(msg)
			done(`reset with Error(${JSON.stringify(msg)})`)
		},
	}

	function start(w, name, firstData) {
		const label = opts.impl === 'libp2p' ? `${w.label} ${JSON.stringify(name)}` : w.label
		names.push(opts.impl === 'libp2p' ? { line: name, id: w.name } : name)
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
	}

	mx.onStream(w => {
		open.add(w)
		if (opts.impl === 'multiplex') start(w, String(w.name), null)
		// libp2p: the name is the first line of the stream's data.
		else readNameLine(w, (name, rest) => start(w, name, rest), finish, fail)
	})

	await waitClose(sock, 1e9)
	log('connection closed')
	await new Promise(r => setTimeout(r, 10)) // let close events run
	finalChecks(mx, fail)
	const unfinished = [...open].map(w => w.label)
	if (unfinished.length) log(`streams not finished when the connection ended: ${unfinished.join(', ')}`)
	const summary = {
		ok: failures.length === 0,
		mode: 'responder',
		impl: opts.impl,
		transport,
		handled,
		names,
		unfinished,
		failures,
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
		impl: opts.impl,
		transport,
		channels: opts.channels,
		size: opts.size,
		big: opts.big,
	}
	const libp2p = opts.impl === 'libp2p'
	// libp2p mode: every stream starts with its name line (see the header).
	const open = name => openNamed(mx, name, libp2p)

	async function nameStream() {
		const name = 'name/héllo wörld/✓'
		const { w, received } = await open(name)
		await w.end()
		const reply = (await received).toString('utf8')
		const out = { sent: name, sent_as: libp2p ? w.name : name, reply, carried: reply === name }
		log(`name: ${JSON.stringify(out)}`)
		if (!libp2p && reply !== name) throw new Error(`name reply mismatch: ${JSON.stringify(reply)} !== ${JSON.stringify(name)}`)
		return out
	}

	async function errorStream() {
		const name = 'error/boom from python'
		const { received } = await open(name)
		const out = await streamOutcome(received, { outcome: null, error_name: null, message: null, bytes: 0 })
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
		const expected = countAndSha256(data)
		const { w, received } = await open('big/x')
		await w.write(data) // ONE write
		await w.end()
		const reply = (await received).toString('utf8')
		if (reply !== expected) throw new Error(`big reply ${JSON.stringify(reply)} !== ${JSON.stringify(expected)}`)
		return { reply, ms: Date.now() - t }
	}

	// The error stream opens first: the responder's reset then leads its side of the
	// connection, before any echo (a capture's first bytes show the reset's text).
	const [errRes, echoRes, nameRes, hcRes, bigRes] = await Promise.all([
		settle('error', errorStream(), fail),
		echoAll(opts.channels, i => echoCheck(open, i, opts.size).then(r => r.bytes), fail),
		settle('name', nameStream(), fail),
		settle('halfclose', halfcloseCheck(open), fail),
		settle('big', bigStream(), fail),
	])

	result.echo_ok = echoRes.r.filter(x => x.ok).length
	result.echo_ms = echoRes.ms
	result.echo_mib_per_s = mibPerS(2 * opts.channels * opts.size, echoRes.ms)
	result.name = nameRes.v
	result.halfclose_reply = hcRes.v
	result.error_stream = errRes.v
	result.big = bigRes.v
	finalChecks(mx, fail)
	result.elapsed_ms = Date.now() - t0
	result.ok = failures.length === 0
	result.failures = failures
	writeSummary(result)

	await closeAndWait(mx, sock)
	return result.ok
}

// ---------------------------------------------------------------- main
runPeer(async sock => {
	const mx = opts.impl === 'multiplex' ? setupMultiplex(sock) : await setupLibp2p(sock)
	log(`${opts.impl} muxer ready`)
	return opts.mode === 'responder' ? await runResponder(mx, sock) : await runDriver(mx, sock)
})
