#!/usr/bin/env node
'use strict'
/*
 * Interop test peer for polymux: drives the reference JS implementation of
 * MultiplexingStream (npm `nerdbank-streams`, pinned to 2.13.16 in package.json)
 * over a real TCP or unix socket.
 *
 *   node mstream_peer.js --listen|--connect --tcp PORT|--unix PATH
 *        --version 1|2|3 --mode responder|driver
 *        [--channels N] [--size BYTES] [--timeout-ms MS]
 *        [--reject required|reset] [--reset-text required|any]
 *
 * The last two loosen the driver's checks for a remote that reaches the responder
 * through a format that cannot say everything MultiplexingStream says (polymux bridge
 * to yamux): --reject reset also accepts a reject/x offer that is accepted and then
 * terminated with an error (a format without refusal); --reset-text any accepts any
 * error text on error/* (a format without reset text).  The defaults are the strict
 * checks.
 *
 * stdout: `LISTENING <port|path>` (listen only, once listening), then at the end
 *         one JSON summary line ({"ok":...}).  Everything else goes to stderr.
 * exit:   0 success, 1 a check failed, 2 bad usage, 3 watchdog timeout.
 *
 * Channel behaviours (by channel-name prefix; the driver offers, the responder
 * accepts/rejects and reacts):
 *   echo/*      echo every byte; on remote half-close end() our side; dispose.
 *   name/*      reply the channel name (UTF-8), end(); dispose once the remote
 *               half-closed too.
 *   reject/*    rejectChannel(id).
 *   error/<msg> accept, then dispose(new Error(<msg>)) at once.
 *   halfclose/* count bytes until remote half-close, reply the decimal count, end, dispose.
 *   big/*       read until remote half-close, reply "<count> <sha256 hex>", end, dispose
 *               (as the mplex and yamux peers' big/*).
 *
 * What nerdbank-streams 2.13.16 puts on the wire (read from js/*.js, src/*.ts):
 *
 *  ChannelTerminated (code 4), MultiplexingStreamClass.onChannelDisposed():
 *    payload = (protocolMajorVersion > 1 && error) ? serializeException(error) : <empty>
 *    serializeException(e) = msgpack.encode([`${e.name}: ${e.message}`])
 *    So `channel.dispose(new Error('boom'))` sends
 *      v1:    7-byte header only, payload length 0 (v1 never carries error text)
 *      v2:    msgpack [4, id, bin(msgpack ["Error: boom"])]
 *      v3:    msgpack [4, id, source, bin(msgpack ["Error: boom"])]
 *    and dispose() without error (also rejectChannel) sends [4, id] / [4, id, source]
 *    (no payload element at all: empty payloads are omitted from v2/v3 frames).
 *    On receipt (v2+) a non-empty payload becomes
 *      new Error(`Received error from remote side: ${decoded[0]}`)
 *    and the channel's `completion` rejects with it; v1 ignores the payload.
 *
 *  The JS port answers every ChannelTerminated for a channel it still has in its
 *  table with its own ChannelTerminated (it disposes the channel, and dispose()
 *  always notifies), echoing the error if there was one (v2+ text then reads
 *  "Error: Received error from remote side: <original>").  A locally disposed
 *  channel stays in the table until the remote's ChannelTerminated arrives.
 *  ChannelTerminated for an id not in the table is ignored silently.
 *
 *  Other wire facts (source + observed with a wire tap):
 *   - Rejecting an offer = ChannelTerminated, no payload.  The offerer's
 *     offerChannelAsync() rejects with CancellationError (message "Operation
 *     cancelled", reason "disposed"), and it then sends its own ChannelTerminated.
 *   - Content, ContentProcessed, ContentWritingCompleted or OfferAccepted for an id
 *     not in the table throws in the frame reader: reading stops for good and
 *     mx.completion rejects ("No channel with id [object Object] found."), but the
 *     library does not close the socket (this peer then disposes and exits 1).
 *   - Unknown control codes (e.g. 6) are skipped.  The JS port never sends code 6.
 *   - v2/v3: every received Content frame is acknowledged at once with
 *     ContentProcessed msgpack [n] (n = that frame's payload length), whether or
 *     not the application read it.  v1 never sends ContentProcessed, and receiving
 *     one in v1 faults the stream ("Not supported in the V1 protocol.").
 *   - v2/v3 Offer payload msgpack [name, 102400]; OfferAccepted [102400].  An
 *     Offer without window size is accepted but the accepter can never write (it
 *     waits for window forever); an OfferAccepted without one makes writes fail
 *     ("Remote window size unknown.").
 *   - Content frames carry at most 20480 bytes.
 *   - CreateAsync's instance reads frames from its constructor on, so a
 *     'channelOffered' event for an Offer that came with the handshake can fire
 *     before the caller subscribes; runResponder() catches up on those.
 */

const crypto = require('crypto')
const fs = require('fs')
const net = require('net')
const { MultiplexingStream } = require('nerdbank-streams')

// ---------------------------------------------------------------- arguments
function usage(msg) {
	if (msg) process.stderr.write(`mstream_peer: ${msg}\n`)
	process.stderr.write(
		'usage: node mstream_peer.js --listen|--connect --tcp PORT|--unix PATH --version 1|2|3 ' +
			'--mode responder|driver [--channels N] [--size BYTES] [--timeout-ms MS] ' +
			'[--reject required|reset] [--reset-text required|any]\n'
	)
	process.exit(2)
}

function parseArgs(argv) {
	const o = { role: null, tcp: null, unix: null, version: null, mode: null, channels: 16, size: 1048576, timeoutMs: 60000, reject: 'required', resetText: 'required' }
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
			case '--version':
				o.version = intArg(a, argv[++i])
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
			case '--timeout-ms':
				o.timeoutMs = intArg(a, argv[++i])
				break
			case '--reject':
				o.reject = argv[++i]
				break
			case '--reset-text':
				o.resetText = argv[++i]
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
	if (![1, 2, 3].includes(o.version)) usage('--version must be 1, 2 or 3')
	if (!['responder', 'driver'].includes(o.mode)) usage('--mode must be responder or driver')
	if (!['required', 'reset'].includes(o.reject)) usage('--reject must be required or reset')
	if (!['required', 'any'].includes(o.resetText)) usage('--reset-text must be required or any')
	return o
}

const opts = parseArgs(process.argv.slice(2))
const t0 = Date.now()
const tag = `[mstream_peer v${opts.version} ${opts.mode}]`
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

// Rejections nobody observed (e.g. a channel completion rejected in a race) must not
// crash node (its default since v15); they are logged instead.
process.on('unhandledRejection', e => log(`unhandled rejection (ignored): ${errText(e)}`))
process.on('uncaughtException', e => {
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
				log(`accepted connection`)
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

async function createMx(sock) {
	if (opts.version === 3) {
		// v3 has no handshake; Create() is synchronous.
		return MultiplexingStream.Create(sock, { protocolMajorVersion: 3 })
	}
	// v1/v2 exchange a handshake (v1: magic 2F DF 1D 50 + 16 random bytes;
	// v2: msgpack [[2, 0], bin(16 random bytes)]) before the promise resolves.
	return MultiplexingStream.CreateAsync(sock, { protocolMajorVersion: opts.version })
}

/** Waits until every frame queued so far has been handed to the socket. */
async function flushFrames(mx, sock) {
	// MultiplexingStreamClass serialises frame writes through a private FIFO semaphore;
	// queueing a no-op behind it is an exact barrier. mx.dispose() drops queued frames.
	if (mx.sendingSemaphore && typeof mx.sendingSemaphore.use === 'function') {
		await mx.sendingSemaphore.use(async () => {})
	} else {
		await new Promise(r => setTimeout(r, 100))
	}
	while (sock.writableLength > 0 && !sock.destroyed) {
		await new Promise(r => setTimeout(r, 5))
	}
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

/** Writes buf to a writable in chunks, honouring write() === false / 'drain'. */
async function writeAll(stream, buf, chunkSize = 65536) {
	for (let off = 0; off < buf.length; off += chunkSize) {
		const ok = stream.write(buf.subarray(off, Math.min(off + chunkSize, buf.length)))
		if (!ok) {
			await new Promise((resolve, reject) => {
				const onDrain = () => {
					stream.removeListener('error', onErr)
					resolve()
				}
				const onErr = e => {
					stream.removeListener('drain', onDrain)
					reject(e)
				}
				stream.once('drain', onDrain)
				stream.once('error', onErr)
			})
		}
	}
}

/**
 * Attaches 'data'/'end'/'error' listeners right away and returns a promise of all bytes
 * received until the readable side ends (remote ContentWritingCompleted or termination).
 */
function collect(stream) {
	const chunks = []
	let n = 0
	return new Promise((resolve, reject) => {
		stream.on('data', c => {
			chunks.push(c)
			n += c.length
		})
		stream.once('end', () => resolve(Buffer.concat(chunks, n)))
		stream.once('error', reject)
	})
}

function endAsync(stream) {
	return new Promise((resolve, reject) => {
		stream.once('error', reject)
		stream.end(() => resolve())
	})
}

// ---------------------------------------------------------------- responder
async function runResponder(mx, sock) {
	const failures = []
	const handled = { echo: 0, name: 0, reject: 0, error: 0, halfclose: 0, big: 0, unknown: 0 }
	const fail = msg => {
		failures.push(msg)
		log(`FAIL: ${msg}`)
	}

	// Generic plumbing for the accepting behaviours: dispose once the remote half-closed
	// ('end') and our writable side finished ('finish' = after ContentWritingCompleted
	// was queued behind all our Content frames).
	function wire(ch, label, onData, onEnd) {
		const s = ch.stream
		let ended = false
		let finished = false
		const maybeDispose = () => {
			if (ended && finished && !ch.isDisposed) {
				log(`${label}: done, disposing`)
				ch.dispose()
			}
		}
		s.on('data', onData)
		s.on('end', () => {
			ended = true
			if (!ch.isDisposed) onEnd()
			maybeDispose()
		})
		s.on('finish', () => {
			finished = true
			maybeDispose()
		})
		s.on('error', e => fail(`${label}: stream error ${errText(e)}`))
		ch.completion.then(
			() => log(`${label}: completion resolved`),
			e => fail(`${label}: completion rejected: ${errText(e)}`)
		)
	}

	const seen = new Set()
	function onOffered(args) {
		// Raised synchronously from the frame reader; an exception here would fault the mx.
		try {
			const { id, name } = args
			if (seen.has(id)) return
			seen.add(id)
			const label = `ch ${id} ${JSON.stringify(name)}`
			log(`${label}: offered (isAccepted=${args.isAccepted})`)
			const slash = name.indexOf('/')
			const kind = slash >= 0 ? name.slice(0, slash) : name
			switch (kind) {
				case 'echo': {
					handled.echo++
					const ch = mx.acceptChannel(id)
					const s = ch.stream
					let bytes = 0
					let waitingDrain = false
					wire(
						ch,
						label,
						chunk => {
							bytes += chunk.length
							if (!s.write(chunk) && !waitingDrain) {
								waitingDrain = true
								s.pause()
								s.once('drain', () => {
									waitingDrain = false
									s.resume()
								})
							}
						},
						() => {
							log(`${label}: remote half-closed after ${bytes} bytes; ending`)
							s.end()
						}
					)
					break
				}
				case 'name': {
					handled.name++
					const ch = mx.acceptChannel(id)
					const s = ch.stream
					wire(
						ch,
						label,
						() => {},
						() => {}
					)
					s.end(Buffer.from(name, 'utf8'))
					break
				}
				case 'halfclose': {
					handled.halfclose++
					const ch = mx.acceptChannel(id)
					const s = ch.stream
					let bytes = 0
					wire(
						ch,
						label,
						chunk => {
							bytes += chunk.length
						},
						() => {
							log(`${label}: remote half-closed after ${bytes} bytes`)
							s.end(Buffer.from(String(bytes), 'utf8'))
						}
					)
					break
				}
				case 'big': {
					handled.big++
					const ch = mx.acceptChannel(id)
					const s = ch.stream
					const hash = crypto.createHash('sha256')
					let bytes = 0
					wire(
						ch,
						label,
						chunk => {
							bytes += chunk.length
							hash.update(chunk)
						},
						() => {
							log(`${label}: remote half-closed after ${bytes} bytes`)
							s.end(Buffer.from(`${bytes} ${hash.digest('hex')}`, 'utf8'))
						}
					)
					break
				}
				case 'reject': {
					handled.reject++
					mx.rejectChannel(id) // -> ChannelTerminated with no payload
					log(`${label}: rejected`)
					break
				}
				case 'error': {
					handled.error++
					const ch = mx.acceptChannel(id)
					const s = ch.stream
					// Anything the remote still sends lands in a disposed channel (push after EOF);
					// that is expected here and only logged.
					s.on('error', e => log(`${label}: stream error (expected after dispose): ${errText(e)}`))
					s.resume()
					ch.completion.then(
						() => log(`${label}: completion resolved`),
						e => log(`${label}: completion rejected (expected): ${errText(e)}`)
					)
					const msg = name.slice(slash + 1)
					ch.dispose(new Error(msg))
					log(`${label}: accepted and disposed with Error(${JSON.stringify(msg)})`)
					break
				}
				default:
					handled.unknown++
					log(`${label}: unknown behaviour, rejecting`)
					mx.rejectChannel(id)
			}
		} catch (e) {
			fail(`channelOffered handler threw: ${e && e.stack ? e.stack : errText(e)}`)
		}
	}
	mx.on('channelOffered', onOffered)

	// CreateAsync's MultiplexingStream starts reading frames in its constructor, a few
	// microtasks before the promise resolves: an Offer that arrived together with the
	// handshake raises 'channelOffered' before anyone could subscribe, and the event is
	// lost.  Such offers still sit in the (protected) per-name queue, so catch up on them.
	const queues = mx.channelsOfferedByThemByName || {}
	for (const qname of Object.keys(queues)) {
		for (const ch of [...queues[qname]]) {
			if (!ch.isAccepted && !ch.isRejectedOrCanceled && !ch.isDisposed) {
				log(`ch ${ch.id} ${JSON.stringify(ch.name)}: offer arrived before subscription; handling it now`)
				onOffered({ id: ch.id, name: ch.name, isAccepted: false })
			}
		}
	}

	let mxError = null
	await mx.completion.catch(e => {
		mxError = e
	})
	if (mxError) fail(`MultiplexingStream faulted: ${errText(mxError)}`)
	else log('MultiplexingStream completed (socket ended)')
	mx.dispose()
	if (!(await waitClose(sock, 2000))) sock.destroy()
	const summary = { ok: failures.length === 0, mode: 'responder', version: opts.version, handled, failures, elapsed_ms: Date.now() - t0 }
	process.stdout.write(JSON.stringify(summary) + '\n')
	return failures.length === 0
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
		version: opts.version,
		transport: opts.unix !== null ? 'unix' : 'tcp',
		channels: opts.channels,
		size: opts.size,
	}

	// A fault of the whole stream fails everything still pending.
	let mxFault = null
	mx.completion.then(
		() => log('MultiplexingStream completion resolved'),
		e => {
			mxFault = e
			fail(`MultiplexingStream faulted: ${errText(e)}`)
		}
	)

	async function echoChannel(i) {
		const name = `echo/${i}`
		const data = pattern(i, opts.size)
		const ch = await mx.offerChannelAsync(name)
		const s = ch.stream
		const received = collect(s)
		const completion = ch.completion.then(
			() => null,
			e => e
		)
		await writeAll(s, data)
		await endAsync(s)
		const got = await received
		const d = firstDiff(data, got)
		if (d !== -1) {
			throw new Error(`${name}: echo mismatch: sent ${data.length} got ${got.length} bytes, first difference at offset ${d}`)
		}
		ch.dispose()
		const e = await completion
		if (e) throw new Error(`${name}: completion rejected: ${errText(e)}`)
		return got.length
	}

	async function nameChannel() {
		const name = 'name/héllo wörld/✓'
		const ch = await mx.offerChannelAsync(name)
		const received = collect(ch.stream)
		await endAsync(ch.stream)
		const got = (await received).toString('utf8')
		ch.dispose()
		if (got !== name) throw new Error(`name reply mismatch: ${JSON.stringify(got)} !== ${JSON.stringify(name)}`)
		return got
	}

	async function halfcloseChannel() {
		const ch = await mx.offerChannelAsync('halfclose/x')
		const received = collect(ch.stream)
		await writeAll(ch.stream, pattern(99, 300000))
		await endAsync(ch.stream)
		const got = (await received).toString('utf8')
		ch.dispose()
		if (got !== '300000') throw new Error(`halfclose reply ${JSON.stringify(got)} !== "300000"`)
		return got
	}

	async function rejectChannel() {
		try {
			const ch = await mx.offerChannelAsync('reject/x')
			if (opts.reject === 'reset') return await terminatedAfterAccept(ch)
			ch.dispose()
		} catch (e) {
			// Rejection = remote ChannelTerminated for an offer not yet accepted; the JS port
			// disposes the channel and acceptance rejects with CancellationError('disposed').
			const info = { name: e && e.name, message: e && e.message, reason: e && e.reason, ctor: e && e.constructor && e.constructor.name }
			log(`reject/x: offer rejected as expected: ${JSON.stringify(info)}`)
			return info
		}
		throw new Error('reject/x: offer was accepted, expected rejection')
	}

	/** --reject reset: the accepted reject/x must end with an error from the remote. */
	async function terminatedAfterAccept(ch) {
		const out = { accepted: true, completion: null, message: null }
		ch.stream.on('error', () => {})
		ch.stream.resume()
		try {
			await ch.completion
			out.completion = 'resolved'
		} catch (e) {
			out.completion = 'rejected'
			out.message = e && e.message
		}
		log(`reject/x: accepted, then ${JSON.stringify(out)}`)
		if (out.completion !== 'rejected') throw new Error(`reject/x: accepted and not terminated with an error: ${JSON.stringify(out)}`)
		return out
	}

	async function errorChannel() {
		const ch = await mx.offerChannelAsync('error/boom from python')
		const s = ch.stream
		const out = { completion: null, message: null, stream_ended: false, stream_error: null, bytes: 0 }
		const streamDone = new Promise(resolve => {
			s.on('data', c => (out.bytes += c.length))
			s.once('end', () => {
				out.stream_ended = true
				resolve()
			})
			s.once('error', e => {
				out.stream_error = errText(e)
				resolve()
			})
		})
		try {
			await ch.completion
			out.completion = 'resolved'
		} catch (e) {
			out.completion = 'rejected'
			out.message = e && e.message
		}
		await streamDone
		log(`error/: ${JSON.stringify(out)}`)
		if (opts.version >= 2 && opts.resetText === 'any') {
			if (out.completion !== 'rejected') throw new Error(`error/: expected completion to reject, got ${JSON.stringify(out)}`)
		} else if (opts.version >= 2) {
			if (out.completion !== 'rejected' || !String(out.message).includes('boom from python')) {
				throw new Error(`error/: expected completion to reject with "boom from python", got ${JSON.stringify(out)}`)
			}
		} else if (!out.stream_ended && !out.stream_error) {
			throw new Error(`error/: v1 channel neither ended nor failed: ${JSON.stringify(out)}`)
		}
		return out
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
	for (let i = 0; i < opts.channels; i++) {
		echoes.push(named(`echo/${i}`, echoChannel(i)))
	}
	const echoAll = Promise.all(echoes).then(r => ({ r, ms: Date.now() - tEcho }))
	const [echoRes, nameRes, hcRes, rejRes, errRes] = await Promise.all([
		echoAll,
		named('name', nameChannel()),
		named('halfclose', halfcloseChannel()),
		named('reject', rejectChannel()),
		named('error', errorChannel()),
	])

	const echoed = echoRes.r.filter(x => x.ok).length
	result.echo_ok = echoed
	result.echo_ms = echoRes.ms
	result.echo_mib_per_s = +((2 * opts.channels * opts.size) / 1048576 / (echoRes.ms / 1000)).toFixed(2)
	result.name = nameRes.v
	result.halfclose_reply = hcRes.v
	result.reject_error = rejRes.v
	result.error_channel = errRes.v
	result.elapsed_ms = Date.now() - t0

	await flushFrames(mx, sock).catch(() => {})
	result.ok = failures.length === 0 && !mxFault
	result.failures = failures
	process.stdout.write(JSON.stringify(result) + '\n')

	mx.dispose() // ends our half of the socket
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
	const mx = await createMx(sock)
	log(`MultiplexingStream v${opts.version} ready`)
	const ok = opts.mode === 'responder' ? await runResponder(mx, sock) : await runDriver(mx, sock)
	exit(ok ? 0 : 1, ok ? 'success' : 'FAILED')
}

main().catch(e => exit(1, `fatal: ${e && e.stack ? e.stack : errText(e)}`))
