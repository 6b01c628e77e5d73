/*
 * What the ESM interop peers (mplex_peer.mjs, yamux_peer.mjs) share: the command
 * line, the process guards (watchdog, exit codes, unix socket cleanup), the one
 * connection over TCP or a unix socket, the stdout conventions, the net.Socket ->
 * libp2p MultiaddrConnection adaptor, the stream wrapper base classes, the data
 * helpers, and the responder behaviours / driver checks both peers run.
 *
 * Conventions (the Python tests depend on them):
 *   stdout: `LISTENING <port|path>` (listen only), then one JSON summary line
 *           ({"ok":...}, writeSummary).  Everything else goes to stderr (log).
 *   exit:   0 success, 1 a check failed / unexpected error, 2 bad usage, 3 watchdog.
 *
 * mstream_peer.js (CommonJS) keeps its own copies: it cannot import an ES module
 * synchronously.
 */

import fs from 'node:fs'
import net from 'node:net'
import crypto from 'node:crypto'

// The libp2p packages call Promise.withResolvers() (Node >= 22).  Installed when this
// module is imported, so before a peer's dynamic import() of a libp2p package.
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

// ---------------------------------------------------------------- the peer process
/**
 * This process's peer, filled in by startPeer():
 *   opts        the parsed command line
 *   t0          start time (ms) for log stamps and elapsed_ms
 *   tag         stderr prefix, e.g. "[mplex_peer libp2p driver]"
 *   transport   "tcp" | "unix"
 *   fatalCount  exceptions thrown by handlers (uncaught, or thrown by stream callbacks)
 */
export const peer = { name: '', opts: null, t0: Date.now(), tag: '', transport: '', fatalCount: 0, debugEnv: null }

export function errText(e) {
	if (e === null || e === undefined) return String(e)
	if (e instanceof Error) return `${e.name}: ${e.message}`
	return String(e)
}

export function log(...args) {
	process.stderr.write(`${peer.tag} +${Date.now() - peer.t0}ms ${args.join(' ')}\n`)
}

/** The JSON summary: the last line on stdout. */
export function writeSummary(obj) {
	process.stdout.write(JSON.stringify(obj) + '\n')
}

const COMMON_USAGE = '--listen|--connect --tcp PORT|--unix PATH --mode responder|driver [--channels N] [--size BYTES] [--big BYTES] [--timeout-ms MS]'

function parseArgs(argv, spec) {
	const usage = msg => {
		if (msg) process.stderr.write(`${spec.name}: ${msg}\n`)
		process.stderr.write(`usage: node ${spec.name}.mjs ${spec.usage || ''}${COMMON_USAGE}\n`)
		process.exit(2)
	}
	const stringFlags = spec.stringFlags || {}
	const o = { role: null, tcp: null, unix: null, mode: null, ...spec.defaults }
	for (const key of Object.values(stringFlags)) o[key] = null
	const intArg = (name, v) => {
		if (v === undefined || !/^\d+$/.test(v)) usage(`${name} needs a non-negative integer`)
		return parseInt(v, 10)
	}
	for (let i = 0; i < argv.length; i++) {
		const a = argv[i]
		if (Object.hasOwn(stringFlags, a)) {
			o[stringFlags[a]] = argv[++i]
			continue
		}
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
	if (spec.check) spec.check(o, usage)
	if (!o.role) usage('one of --listen/--connect is required')
	if ((o.tcp === null) === (o.unix === null)) usage('exactly one of --tcp/--unix is required')
	if (!['responder', 'driver'].includes(o.mode)) usage('--mode must be responder or driver')
	return o
}

/**
 * Parses the command line (exit 2 on bad usage), then arms the watchdog (exit 3 after
 * --timeout-ms) and the process guards.  spec:
 *   name         "mplex_peer": usage text, error prefix and log tag
 *   usage        peer-specific usage text before the common flags ("--impl ... ")
 *   defaults     { channels, size, big, timeoutMs }
 *   stringFlags  extra flags taking a string: { '--impl': 'impl' }
 *   check(o, usage)  peer-specific checks, run before the common ones
 *   tag(o)       what follows the name in the log tag
 *   debugEnv     environment variable that turns on the libp2p log ("=1")
 * Returns `peer`.
 */
export function startPeer(spec) {
	peer.name = spec.name
	peer.debugEnv = spec.debugEnv || null
	const opts = (peer.opts = parseArgs(process.argv.slice(2), spec))
	peer.t0 = Date.now()
	peer.tag = `[${spec.name} ${spec.tag(opts)}]`
	peer.transport = opts.unix !== null ? 'unix' : 'tcp'

	const watchdog = setTimeout(() => {
		process.stderr.write(`${peer.tag} TIMEOUT: watchdog fired after ${opts.timeoutMs} ms\n`)
		cleanup()
		process.exit(3)
	}, opts.timeoutMs)
	watchdog.unref()

	process.on('unhandledRejection', e => log(`unhandled rejection (ignored): ${errText(e)}`))
	process.on('uncaughtException', e => {
		peer.fatalCount++
		log(`uncaught exception: ${e && e.stack ? e.stack : errText(e)}`)
		exit(1)
	})
	return peer
}

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
export function exit(code, msg) {
	if (exiting) return
	exiting = true
	if (msg) log(msg)
	cleanup()
	process.exitCode = code
	// Give stdout/stderr a moment to flush when they are pipes.
	setTimeout(() => process.exit(code), 20).unref()
}

/**
 * Gets the one connection (--listen: prints LISTENING, accepts ONE connection;
 * --connect: connects), then exits with 0 if body(sock) resolves true, else 1.
 */
export function runPeer(body) {
	const main = async () => {
		const sock = await getSocket()
		sock.setNoDelay && sock.setNoDelay(true)
		sock.on('error', e => log(`socket error: ${errText(e)}`))
		const ok = await body(sock)
		exit(ok ? 0 : 1, ok ? 'success' : 'FAILED')
	}
	main().catch(e => exit(1, `fatal: ${e && e.stack ? e.stack : errText(e)}`))
}

// ---------------------------------------------------------------- transport
function getSocket() {
	const opts = peer.opts
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

/** Resolves true once the socket closed, false after ms. */
export function waitClose(sock, ms) {
	return new Promise(resolve => {
		if (sock.destroyed) return resolve(true)
		const t = setTimeout(() => resolve(false), ms)
		sock.once('close', () => {
			clearTimeout(t)
			resolve(true)
		})
	})
}

/** After the driver's summary: close the muxer, give the remote 2 s to close the socket. */
export async function closeAndWait(mx, sock) {
	await mx.close()
	if (!(await waitClose(sock, 2000))) {
		log('remote did not close within 2 s; destroying socket')
		sock.destroy()
	}
}

// ---------------------------------------------------------------- libp2p plumbing
/** The logger a libp2p component wants; prints only with <debugEnv>=1. */
export function makeLibp2pLogger(name) {
	const enabled = peer.debugEnv !== null && process.env[peer.debugEnv] === '1'
	const out = (level, fmt, ...args) => {
		if (!enabled) return
		process.stderr.write(`${peer.tag} libp2p ${level} ${name}: ${fmt} ${args.map(a => (a instanceof Error ? errText(a) : typeof a === 'object' ? JSON.stringify(a) : String(a))).join(' ')}\n`)
	}
	const f = (fmt, ...args) => out('log', fmt, ...args)
	f.enabled = enabled
	f.trace = (fmt, ...args) => out('trace', fmt, ...args)
	f.error = (fmt, ...args) => out('error', fmt, ...args)
	f.newScope = scope => makeLibp2pLogger(`${name}:${scope}`)
	return f
}

/**
 * The MultiaddrConnection a libp2p muxer needs: an EventTarget with 'message' (evt.data),
 * 'drain' and 'close' events, send(Uint8ArrayList | Uint8Array) -> boolean, abort(err),
 * close(), log, and `direction` (yamux: 'outbound' makes the muxer a client, odd ids;
 * @libp2p/mplex does not read it).
 * (What @libp2p/tcp's unexported socket-to-conn does, minus multiaddrs and metrics.)
 *   direction   'outbound' | 'inbound' | undefined
 *   rxTap/txTap optional, feed(buf) sees every byte received / sent
 *   endOnAbort  abort() end()s the socket (destroyed 500 ms later) instead of destroying
 *               it at once: yamux queues RSTs and a GoAway just before it aborts, and
 *               end() lets them reach the peer.  mplex keeps destroy(), as @libp2p/tcp
 *               does (what mplex_peer.mjs documents for an oversized frame).
 */
export class SocketMaConn extends EventTarget {
	constructor(sock, { direction, rxTap = null, txTap = null, endOnAbort = false } = {}) {
		super()
		this.sock = sock
		this.direction = direction
		this.rxTap = rxTap
		this.txTap = txTap
		this.endOnAbort = endOnAbort
		this.log = makeLibp2pLogger('maconn')
		this.status = 'open'
		this.aborted = null
		sock.on('data', buf => {
			if (rxTap) rxTap.feed(buf)
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
		// mplex always passes a Uint8ArrayList; yamux a Uint8ArrayList for Data frames
		// (header + payload) and a bare Uint8Array (the 12-byte header) for the others.
		const list = data instanceof Uint8Array ? [data] : data
		let ok = true
		this.sock.cork()
		for (const b of list) {
			if (this.txTap) this.txTap.feed(Buffer.from(b.buffer, b.byteOffset, b.byteLength))
			ok = this.sock.write(b)
		}
		this.sock.uncork()
		return ok
	}
	abort(err) {
		this.aborted = err
		log(`connection aborted by the muxer: ${errText(err)}`)
		if (this.endOnAbort) {
			this.sock.end()
			setTimeout(() => this.sock.destroy(), 500).unref()
		} else {
			this.sock.destroy()
		}
	}
	async close() {
		this.sock.end()
	}
}

/**
 * The muxer object the responder / driver code drives, for a @libp2p/utils muxer over
 * maConn: { muxer, fault, onStream(cb(stream)), open(name) -> Promise<stream>, close() }.
 *   wrap(s, label)  the stream wrapper for a package stream
 *   idOf(s)         the stream id shown in labels
 *   isFault(err)    whether a muxer abort counts as a connection fault (default: yes)
 * A connection-level failure aborts every stream: muxer.abort is wrapped to record it in
 * mx.fault and log it (unless the muxer was closed already).
 */
export function libp2pMux(muxer, maConn, { wrap, idOf, isFault = () => true }) {
	const mx = {
		fault: null,
		muxer,
		onStream(cb) {
			muxer.addEventListener('stream', evt => {
				const s = evt.detail
				cb(wrap(s, `stream ${idOf(s)}`))
			})
		},
		async open(name) {
			const s = await muxer.createStream()
			return wrap(s, `stream ${idOf(s)} ${JSON.stringify(name)}`)
		},
		async close() {
			await muxer.close().catch(e => log(`muxer.close: ${errText(e)}`))
			await maConn.close()
		},
	}
	const origAbort = muxer.abort.bind(muxer)
	muxer.abort = err => {
		if (muxer.status !== 'closed' && isFault(err)) {
			mx.fault = err
			log(`muxer aborted: ${errText(err)}`)
		}
		origAbort(err)
	}
	return mx
}

// ---------------------------------------------------------------- stream wrappers
/*
 * A stream as the responder / driver code sees it.  The implementation's listeners are
 * attached in the subclass constructor (libp2p buffers data with no 'message' listener,
 * and aborts the stream past maxReadBufferLength); the application sets
 * onData/onEnd/onError synchronously right after construction, before any event can be
 * delivered.
 *   onData(buf)   bytes from the remote
 *   onEnd()       the remote half-closed and all its data was delivered
 *   onError(err)  the stream failed: remote reset, local abort, or the connection ended
 *                 before the remote half-closed.  Called at most once, never after onEnd.
 * Subclasses provide write(buf) -> Promise (with backpressure), end() (half-close),
 * pause(), resume(), reset(msg).
 */
export class CallbackStream {
	constructor(label) {
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
			peer.fatalCount++
		}
	}
	_end() {
		if (this.ended || this.failed) return
		this.ended = true
		try {
			this.onEnd()
		} catch (e) {
			log(`${this.label}: onEnd threw: ${e && e.stack ? e.stack : errText(e)}`)
			peer.fatalCount++
		}
	}
	_error(err) {
		if (this.failed || this.localReset) return
		this.failed = true
		try {
			this.onError(err)
		} catch (e) {
			log(`${this.label}: onError threw: ${e && e.stack ? e.stack : errText(e)}`)
			peer.fatalCount++
		}
	}
}

/**
 * A stream of a @libp2p/utils 7.x muxer (@libp2p/mplex, @chainsafe/libp2p-yamux).
 * write() is the subclass's: the two peers wait for backpressure differently.
 */
export class Libp2pStream extends CallbackStream {
	constructor(s, label) {
		super(label)
		this.s = s
		this.id = s.streamId
		let remoteClosed = false
		s.addEventListener('message', e => this._data(Buffer.from(e.data.subarray())))
		s.addEventListener('remoteCloseWrite', () => {
			remoteClosed = true
		})
		// 'end' also fires on reset/abort/transport close (before 'close'): only a real
		// remote half-close (mplex Close, yamux FIN) counts as end of data.
		s.addEventListener('end', () => {
			if (remoteClosed && s.status !== 'reset' && s.status !== 'aborted') this._end()
		})
		s.addEventListener('close', e => {
			if (e.error) this._error(e.error)
			// (remote half-close seen but data still buffered while paused: 'end' follows on resume)
			else if (!this.ended && !remoteClosed) this._error(this._closedEarlyError())
		})
	}
	/** The error for a stream closed without error before the remote half-closed. */
	_closedEarlyError() {
		return new Error(`stream closed before the remote half-closed (status ${this.s.status})`)
	}
	/** Half-close after all queued data. */
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

// ---------------------------------------------------------------- data helpers
/** The deterministic test data: byte j = (j*31 + i*7) & 0xff (also in the Python tests). */
export function pattern(i, size) {
	const b = Buffer.allocUnsafe(size)
	const base = (i * 7) & 0xff
	for (let j = 0; j < size; j++) b[j] = (j * 31 + base) & 0xff
	return b
}

/** Offset of the first differing byte, -1 if a and b are equal. */
export function firstDiff(a, b) {
	const n = Math.min(a.length, b.length)
	for (let k = 0; k < n; k++) if (a[k] !== b[k]) return k
	return a.length === b.length ? -1 : n
}

/** Writes buf in chunkSize pieces, each after the previous was accepted (backpressure). */
export async function writeAll(w, buf, chunkSize = 65536) {
	for (let off = 0; off < buf.length; off += chunkSize) {
		await w.write(buf.subarray(off, Math.min(off + chunkSize, buf.length)))
	}
}

/** Promise of all bytes until the remote half-closes; rejects if the stream fails. */
export function collect(w) {
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

/** The big/* reply for buf: "<count> <sha256 hex>". */
export function countAndSha256(buf) {
	return `${buf.length} ${crypto.createHash('sha256').update(buf).digest('hex')}`
}

/** MiB/s for bytes moved in ms (at least 1 ms), two decimals. */
export function mibPerS(bytes, ms) {
	return +(bytes / 1048576 / (Math.max(1, ms) / 1000)).toFixed(2)
}

/** A failure list and fail(msg), which records and logs. */
export function failureList() {
	const failures = []
	const fail = msg => {
		failures.push(msg)
		log(`FAIL: ${msg}`)
	}
	return { failures, fail }
}

/** Failures every summary checks at the end: a connection-level fault, handler exceptions. */
export function finalChecks(mx, fail) {
	if (mx.fault) fail(`connection fault: ${errText(mx.fault)}`)
	if (peer.fatalCount) fail(`${peer.fatalCount} handler exception(s)`)
}

// ---------------------------------------------------------------- responder
/**
 * Reads the line `<name>\n` an opener writes first on a stream whose protocol carries
 * no name (yamux, @libp2p/mplex), then calls onName(name, rest of the data).  A stream
 * that ends or fails first, or sends 64 KiB without a newline, is a failure:
 * finish(w) then fail(msg).
 */
export function readNameLine(w, onName, finish, fail) {
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
		onName(buf.subarray(0, nl).toString('utf8'), buf.subarray(nl + 1))
	}
	w.onEnd = () => {
		finish(w)
		fail(`${w.label}: remote half-closed before sending a name line (${n} bytes)`)
	}
	w.onError = e => {
		finish(w)
		fail(`${w.label}: stream failed before its name line: ${errText(e)}`)
	}
}

/**
 * The responder side of one stream, by the kind of its name (the part before the
 * first "/"; see the peers' headers):
 *   echo, halfclose, big  here
 *   special[kind]         the peer's own (name, error): called with a context
 *                         { w, label, name, rest, done, unexpected, replyAndEnd }; returns
 *                         { onData, onEnd }, or nothing when it has finished the stream
 *   (other)               reset, counted as handled.unknown
 * firstData: bytes that arrived with the name line.  done(what) logs the end of our
 * side, unexpected(err) records a failure.
 */
export function startBehaviour(w, name, firstData, { label, handled, done, unexpected, special = {} }) {
	const slash = name.indexOf('/')
	const kind = slash >= 0 ? name.slice(0, slash) : name
	log(`${label}: ${kind}`)
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
	if (Object.hasOwn(special, kind)) {
		const r = special[kind]({ w, label, name, rest: name.slice(slash + 1), done, unexpected, replyAndEnd })
		if (!r) return
		;({ onData, onEnd } = r)
	} else {
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
					// Stop reading this stream while our writes wait for the transport
					// (yamux: stop granting window).
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
			default: {
				handled.unknown++
				w.reset(`unknown behaviour ${name}`)
				done('unknown behaviour: reset')
				return
			}
		}
	}
	w.onData = onData
	w.onEnd = onEnd
	w.onError = unexpected
	if (firstData && firstData.length) onData(firstData)
}

// ---------------------------------------------------------------- driver
/**
 * Opens a stream, attaches the collector at once, and with nameLine writes the line
 * `<name>\n` first.  Returns { w, received: Promise of every byte until the remote
 * half-closes }.
 */
export async function openNamed(mx, name, nameLine) {
	const w = await mx.open(name)
	const received = collect(w)
	received.catch(() => {})
	if (nameLine) await w.write(Buffer.from(name + '\n', 'utf8'))
	return { w, received }
}

/** `echo/<i>`: size bytes of pattern(i) in 64 KiB writes, half-close, compare the echo. */
export async function echoCheck(open, i, size) {
	const name = `echo/${i}`
	const data = pattern(i, size)
	const { w, received } = await open(name)
	await writeAll(w, data)
	await w.end()
	const got = await received
	const d = firstDiff(data, got)
	if (d !== -1) throw new Error(`${name}: echo mismatch: sent ${data.length} got ${got.length} bytes, first difference at offset ${d}`)
	return { w, bytes: got.length }
}

/** `halfclose/x`: 300000 bytes, half-close, the reply must be "300000". */
export async function halfcloseCheck(open) {
	const { w, received } = await open('halfclose/x')
	await writeAll(w, pattern(99, 300000))
	await w.end()
	const got = (await received).toString('utf8')
	if (got !== '300000') throw new Error(`halfclose reply ${JSON.stringify(got)} !== "300000"`)
	return got
}

/** How a stream the remote should reset ended: fills out.outcome/error_name/message/bytes. */
export async function streamOutcome(received, out) {
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
	return out
}

/** p as { ok: true, v } or, after fail(`<label>: <error>`), { ok: false, v: null }. */
export function settle(label, p, fail) {
	return p.then(
		v => ({ ok: true, v }),
		e => {
			fail(`${label}: ${errText(e)}`)
			return { ok: false, v: null }
		}
	)
}

/** Runs echoStream(i) for i < channels at once; Promise of { r: settled results, ms }. */
export function echoAll(channels, echoStream, fail) {
	const t = Date.now()
	const echoes = []
	for (let i = 0; i < channels; i++) echoes.push(settle(`echo/${i}`, echoStream(i), fail))
	return Promise.all(echoes).then(r => ({ r, ms: Date.now() - t }))
}
