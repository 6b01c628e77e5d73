/**
 * polymux's omnistreams client: many byte streams over one WebSocket, for web pages.
 *
 * One dependency-free ES module, no build step; it also runs in Node given a WebSocket-like
 * object (the `ws` package's). The API is described in polymux's docs/browser.md:
 *
 *   import { connect } from '/polymux/omnistreams.js'
 *   const session = await connect('ws://127.0.0.1:8000/ws')
 *   const channel = await session.openPair('chat/lobby')      // both ways (polymux peers)
 *   await channel.write(new TextEncoder().encode('hello'))     // waits for the peer's credit
 *   for await (const chunk of channel.readable) { ... }        // Uint8Array chunks
 *   await channel.close()
 *
 * The protocol (omnistreams-spec wire-protocol.md): one WebSocket message is one mux message,
 * a type byte, a stream id byte (not for CONTROL), then the payload. Streams are one-way: the
 * opener writes, the acceptor reads. Credit counts messages: the reader grants
 * `window / chunkSize` messages and grants them again as the application reads; the writer
 * splits data into chunks of at most its announced `chunkSize` and never sends more messages
 * than it was granted. Creation metadata is a UTF-8 JSON object {name, chunkSize, ...}.
 * A pair (polymux's `Session.open_pair`) is a stream each way: the opener's metadata carries
 * {"pair": token}, the answer's {"replyTo": token}.
 */

/** Message type bytes: the spec's numbering and the older one of npm `omnistreams` 0.9.0. */
export const NUMBERINGS = Object.freeze({
	spec: Object.freeze({ CONTROL: 0, CREATE: 1, DATA: 2, END: 3, CANCEL_RECEIVE: 4, REQUEST_DATA: 5, CANCEL_SEND: 6 }),
	legacy: Object.freeze({ CREATE: 0, DATA: 1, END: 2, CANCEL_SEND: 3, REQUEST_DATA: 4, CONTROL: 5 }),
})

const NAMES = { CONTROL: 'CONTROL_MESSAGE', CREATE: 'CREATE_RECEIVE_STREAM', DATA: 'STREAM_DATA', END: 'STREAM_END', CANCEL_RECEIVE: 'CANCEL_RECEIVE_STREAM', REQUEST_DATA: 'STREAM_REQUEST_DATA', CANCEL_SEND: 'CANCEL_SEND_STREAM' }
const OPEN = 1 // WebSocket.OPEN
const MAX_CONTROLS = 1024 // unread control messages before the session fails (bounded memory)
const MAX_GRANT = 4 * 255 // messages granted per stream: a peer announcing tiny chunks gets no flood of requests
const encoder = new TextEncoder()
const decoder = new TextDecoder('utf-8', { fatal: true })

/**
 * Every error of this module. `code`: 'protocol' (the peer broke the format; the session
 * ends), 'closed' (the session or the stream is closed), 'cancelled' (the peer cancelled the
 * stream), 'limit' (all 256 ids in use, a size out of range), 'timeout', 'usage'.
 */
export class OmnistreamsError extends Error {
	constructor(message, code = 'usage', options = undefined) {
		super(message, options)
		this.name = 'OmnistreamsError'
		this.code = code
	}
}

function toBytes(data, what) {
	if (data instanceof Uint8Array) return data
	if (data instanceof ArrayBuffer) return new Uint8Array(data)
	if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
	if (typeof data === 'string') return encoder.encode(data)
	throw new OmnistreamsError(`${what}: expected bytes (Uint8Array, ArrayBuffer) or a string, got ${typeof data}`)
}

function positiveInt(value, name, max) {
	if (!Number.isInteger(value) || value < 1 || value > max) {
		throw new OmnistreamsError(`${name} must be an integer in 1..${max}, got ${value}`, 'limit')
	}
	return value
}

/**
 * Open a WebSocket to `url` and return a ready Session (see Session for `options`; also
 * `options.WebSocket`, the constructor to use where there is no global one, as in Node).
 */
export async function connect(url, options = {}) {
	const WS = options.WebSocket ?? globalThis.WebSocket
	if (typeof WS !== 'function') {
		throw new OmnistreamsError('connect: no WebSocket here; pass options.WebSocket (in Node: the `ws` package)')
	}
	const ws = new WS(url)
	ws.binaryType = 'arraybuffer'
	await new Promise((resolve, reject) => {
		const done = error => {
			ws.removeEventListener('open', opened)
			ws.removeEventListener('close', closed)
			if (error) reject(error)
			else resolve()
		}
		const opened = () => done()
		const closed = e => done(new OmnistreamsError(`connect: cannot open ${url} (WebSocket close code ${e.code})`, 'closed'))
		ws.addEventListener('open', opened)
		ws.addEventListener('close', closed)
	})
	return new Session(ws, options)
}

/**
 * One omnistreams connection over an open WebSocket (or a WebSocket-like object with
 * `send`, `close`, `readyState`, `binaryType` and `addEventListener`).
 *
 * options: `numbering` ('spec', the default, or 'legacy' for npm omnistreams 0.9.0 peers),
 * `chunkSize` (payload bytes per message we send, announced in our metadata; 65536),
 * `window` (bytes we let each incoming stream send ahead of our reading; 1 MiB),
 * `maxMessageSize` (largest message accepted; 1 MiB + 2), `onchannel(channel)` (incoming
 * channels; otherwise they wait for accept()), `oncontrol(bytes)` (control messages;
 * otherwise they wait for receiveControl()).
 */
export class Session {
	constructor(ws, options = {}) {
		const { numbering = 'spec', chunkSize = 65536, window = 1 << 20, maxMessageSize = (1 << 20) + 2 } = options
		if (!Object.hasOwn(NUMBERINGS, numbering)) {
			throw new OmnistreamsError(`numbering must be 'spec' or 'legacy', got ${JSON.stringify(numbering)}`)
		}
		if (!ws || ws.readyState !== OPEN) throw new OmnistreamsError('Session needs an open WebSocket (use connect(url))', 'closed')
		this.format = numbering === 'spec' ? 'omnistreams' : 'omnistreams-legacy'
		this.maxMessageSize = positiveInt(maxMessageSize, 'maxMessageSize', 2 ** 32 - 1)
		this.chunkSize = positiveInt(chunkSize, 'chunkSize', this.maxMessageSize - 2)
		this.window = positiveInt(window, 'window', 2 ** 32 - 1)
		this.onchannel = options.onchannel ?? null
		this.oncontrol = options.oncontrol ?? null
		this.error = null // why the session ended (an OmnistreamsError), once it has
		this._ws = ws
		this._codes = NUMBERINGS[numbering]
		this._kinds = new Map(Object.entries(this._codes).map(([kind, code]) => [code, kind]))
		this._freeIds = Array.from({ length: 256 }, (_, i) => i) // least recently used first
		this._senders = new Map() // our stream id -> Channel
		this._receivers = new Map() // the peer's stream id -> Channel
		this._cancelled = new Set() // peer ids we cancelled: their late DATA and END are ignored
		this._ended = new Set() // peer ids that ended: DATA or END again is a protocol error
		this._pairs = new Map() // token -> Channel waiting for the peer's answer
		this._incoming = []
		this._acceptWaiters = []
		this._controls = []
		this._controlWaiters = []
		this.closed = new Promise(resolve => (this._resolveClosed = resolve))
		ws.binaryType = 'arraybuffer'
		ws.addEventListener('message', event => this._onMessage(event.data))
		ws.addEventListener('close', event => this._onClose(event.code, event.reason))
	}

	/** Open a stream we write (the peer reads it); `metadata` keys join {name, chunkSize}. */
	open(name = '', metadata = {}) {
		const channel = new Channel(this, String(name))
		channel.metadata = this._openOut(channel, metadata)
		return channel
	}

	/**
	 * Open a channel both ways with a polymux peer (Session.open_pair): a stream to the peer,
	 * and the stream it opens back. Resolves when the answer arrives; rejects after
	 * `timeout` ms (30000; 0 waits forever) or when the session ends.
	 */
	openPair(name = '', metadata = {}, { timeout = 30000 } = {}) {
		const token = randomToken()
		const channel = new Channel(this, String(name))
		try {
			channel.metadata = this._openOut(channel, { ...metadata, pair: token })
		} catch (error) {
			return Promise.reject(error)
		}
		return new Promise((resolve, reject) => {
			const timer = timeout > 0 ? setTimeout(() => {
				this._pairs.delete(token)
				channel.cancel()
				reject(new OmnistreamsError(`${this.format}: openPair(${JSON.stringify(name)}): no answer within ${timeout} ms (is the peer polymux?)`, 'timeout'))
			}, timeout) : null
			this._pairs.set(token, { channel, resolve, reject, timer })
		})
	}

	/** The next incoming channel (a one-way stream, or a pair the peer opened). */
	accept() {
		if (this._incoming.length) return Promise.resolve(this._incoming.shift())
		if (this.error) return Promise.reject(this.error)
		return new Promise((resolve, reject) => this._acceptWaiters.push({ resolve, reject }))
	}

	/** Incoming channels until the session ends: `for await (const ch of session)`. */
	async *[Symbol.asyncIterator]() {
		while (this._incoming.length || !this.error) {
			try {
				yield await this.accept()
			} catch (error) {
				if (error === this.error) return
				throw error
			}
		}
	}

	/** Send a control message (session-level bytes, not tied to a stream). */
	sendControl(data) {
		this._send(this._codes.CONTROL, null, toBytes(data, 'sendControl'))
	}

	/** The peer's next control message (when no `oncontrol` handler takes them). */
	receiveControl() {
		if (this._controls.length) return Promise.resolve(this._controls.shift())
		if (this.error) return Promise.reject(this.error)
		return new Promise((resolve, reject) => this._controlWaiters.push({ resolve, reject }))
	}

	/** Close the WebSocket; streams not ended yet fail with a 'closed' error. */
	close(code = 1000, reason = '') {
		this._end(new OmnistreamsError(`${this.format}: the session was closed`, 'closed'))
		if (this._ws.readyState <= OPEN) this._ws.close(code, reason)
		return this.closed
	}

	// -- internals -------------------------------------------------------------------------

	_openOut(channel, metadata) {
		if (this.error) throw this.error
		if (!this._freeIds.length) throw new OmnistreamsError(`${this.format}: all 256 stream ids are in use`, 'limit')
		const meta = { ...metadata, name: channel.name, chunkSize: this.chunkSize }
		const raw = encoder.encode(JSON.stringify(meta))
		if (raw.length + 2 > this.maxMessageSize) throw new OmnistreamsError(`${this.format}: metadata of ${raw.length} bytes is too large`, 'limit')
		const id = this._freeIds.shift()
		channel._out = { id, credit: 0, ended: false, error: null, wake: null, tail: Promise.resolve(), ending: null }
		this._senders.set(id, channel)
		this._send(this._codes.CREATE, id, raw)
		return meta
	}

	_send(code, id, payload) {
		if (this.error) throw this.error
		if (this._ws.readyState !== OPEN) throw new OmnistreamsError(`${this.format}: the WebSocket is not open`, 'closed')
		if (code === undefined) throw new OmnistreamsError(`${this.format}: this numbering has no such message`)
		const head = id === null ? 1 : 2
		const message = new Uint8Array(head + (payload ? payload.length : 0))
		message[0] = code
		if (id !== null) message[1] = id
		if (payload) message.set(payload, head)
		this._ws.send(message)
	}

	_protocol(detail) {
		return new OmnistreamsError(`${this.format}: ${detail}`, 'protocol')
	}

	_onMessage(data) {
		if (this.error) return
		try {
			if (typeof data === 'string') throw this._protocol('received a text WebSocket message (omnistreams messages are binary)')
			if (!(data instanceof ArrayBuffer) && !ArrayBuffer.isView(data)) throw this._protocol(`unsupported WebSocket message data (${Object.prototype.toString.call(data)}); binaryType must be 'arraybuffer'`)
			this._onBytes(toBytes(data))
		} catch (error) {
			this._fail(error instanceof OmnistreamsError ? error : this._protocol(`cannot handle a message: ${error}`))
		}
	}

	_onBytes(bytes) {
		if (!bytes.length) throw this._protocol('empty message (no type byte)')
		if (bytes.length > this.maxMessageSize) throw this._protocol(`${bytes.length}-byte message exceeds maxMessageSize=${this.maxMessageSize}`)
		const kind = this._kinds.get(bytes[0])
		if (kind === undefined) throw this._protocol(`unknown message type ${bytes[0]} (the ${this.format} numbering has 0..${this._kinds.size - 1})`)
		if (kind === 'CONTROL') return this._onControl(bytes.slice(1))
		if (bytes.length < 2) throw this._protocol(`${NAMES[kind]} message of 1 byte has no stream id byte`)
		const id = bytes[1]
		const payload = bytes.subarray(2)
		if (kind === 'REQUEST_DATA' && payload.length !== 1) throw this._protocol(`STREAM_REQUEST_DATA for stream ${id} has ${payload.length} count bytes (expected 1)`)
		if ((kind === 'END' || kind.startsWith('CANCEL')) && payload.length) throw this._protocol(`${NAMES[kind]} for stream ${id} carries ${payload.length} unexpected bytes`)
		if (kind === 'CREATE') return this._onCreate(id, payload)
		if (kind === 'DATA' || kind === 'END') {
			const channel = this._receivers.get(id)
			if (channel) return kind === 'DATA' ? channel._onData(payload) : this._onEnd(id, channel)
			if (this._cancelled.has(id)) {
				if (kind === 'END') this._cancelled.delete(id) // it ended before our cancel arrived
				return
			}
			if (this._ended.has(id)) throw this._protocol(`${NAMES[kind]} for stream ${id} after its STREAM_END`)
			if (kind === 'END') throw this._protocol(`STREAM_END for stream ${id}, which was never created`)
			this._cancelled.add(id) // the spec: ignore the data and cancel the stream
			return this._send(this._codes.CANCEL_SEND, id, null)
		}
		if (kind === 'CANCEL_RECEIVE') {
			const channel = this._receivers.get(id)
			this._cancelled.delete(id)
			if (channel) {
				this._receivers.delete(id)
				channel._failIn(new OmnistreamsError(`${this.format}: stream ${id} (${JSON.stringify(channel.name)}) was cancelled by the sender`, 'cancelled'))
			}
			return
		}
		const channel = this._senders.get(id)
		if (!channel) return // REQUEST_DATA or CANCEL_SEND racing with our end or cancel
		if (kind === 'REQUEST_DATA') return channel._onCredit(payload[0])
		this._freeOut(channel) // CANCEL_SEND
		channel._failOut(new OmnistreamsError(`${this.format}: stream ${id} (${JSON.stringify(channel.name)}) was cancelled by the receiver`, 'cancelled'))
	}

	_onCreate(id, raw) {
		if (this._receivers.has(id)) throw this._protocol(`CREATE_RECEIVE_STREAM for stream ${id}, which is already open`)
		this._cancelled.delete(id)
		this._ended.delete(id)
		let meta = null
		try {
			const parsed = JSON.parse(decoder.decode(raw))
			if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) meta = parsed
		} catch {
			// not a JSON object: opaque metadata (name '', no chunk size)
		}
		let chunk = this.maxMessageSize - 2
		if (meta && meta.chunkSize !== undefined) {
			const c = meta.chunkSize
			if (!Number.isInteger(c) || c < 1 || c > this.maxMessageSize - 2) {
				throw this._protocol(`chunkSize ${JSON.stringify(c)} of stream ${id} must be an int in 1..${this.maxMessageSize - 2}`)
			}
			chunk = c
		}
		const name = meta && meta.name !== undefined ? String(meta.name) : ''
		const pair = meta && typeof meta.pair === 'string' ? meta.pair : null
		const reply = !pair && meta && typeof meta.replyTo === 'string' ? meta.replyTo : null
		const waiter = reply === null ? null : this._pairs.get(reply)
		if (reply !== null && !waiter) {
			this._cancelled.add(id) // an answer nobody waits for
			return this._send(this._codes.CANCEL_SEND, id, null)
		}
		const channel = waiter ? waiter.channel : new Channel(this, name)
		channel._attachIn(id, chunk, raw)
		this._receivers.set(id, channel)
		if (waiter) {
			this._pairs.delete(reply)
			clearTimeout(waiter.timer)
			waiter.resolve(channel)
			return
		}
		channel.metadata = meta
		if (pair !== null) {
			try {
				this._openOut(channel, { name, replyTo: pair })
			} catch (error) {
				channel.cancel() // no id to answer with: refuse the pair
				return
			}
		}
		this._deliver(channel)
	}

	_onEnd(id, channel) {
		this._receivers.delete(id)
		this._ended.add(id)
		channel._endIn()
	}

	_deliver(channel) {
		if (this.onchannel) return void this.onchannel(channel)
		const waiter = this._acceptWaiters.shift()
		if (waiter) waiter.resolve(channel)
		else this._incoming.push(channel)
	}

	_onControl(data) {
		if (this.oncontrol) return void this.oncontrol(data)
		const waiter = this._controlWaiters.shift()
		if (waiter) return waiter.resolve(data)
		if (this._controls.length >= MAX_CONTROLS) throw this._protocol(`more than ${MAX_CONTROLS} control messages not read (set oncontrol or call receiveControl)`)
		this._controls.push(data)
	}

	_freeOut(channel) {
		const out = channel._out
		if (this._senders.get(out.id) === channel) {
			this._senders.delete(out.id)
			this._freeIds.push(out.id)
		}
	}

	_fail(error) {
		if (this.error) return
		this._end(error)
		try {
			this._ws.close(1002, error.message.slice(0, 40)) // 1002: protocol error; reasons are short
		} catch {
			this._ws.close(1002)
		}
	}

	_onClose(code, reason) {
		const why = reason ? `: ${reason}` : ''
		this._end(new OmnistreamsError(`${this.format}: the connection closed (WebSocket code ${code}${why})`, 'closed'))
		const clean = code === 1000 && this.error.code === 'closed'
		this._resolveClosed({ code, reason, error: clean ? null : this.error })
	}

	_end(error) {
		if (this.error) return
		this.error = error
		for (const channel of new Set([...this._senders.values(), ...this._receivers.values()])) {
			channel._failOut(error)
			channel._failIn(error)
		}
		this._senders.clear()
		this._receivers.clear()
		for (const { reject, timer } of this._pairs.values()) {
			clearTimeout(timer)
			reject(error)
		}
		this._pairs.clear()
		for (const waiter of this._acceptWaiters.splice(0)) waiter.reject(error)
		for (const waiter of this._controlWaiters.splice(0)) waiter.reject(error)
	}
}

function randomToken() {
	const bytes = new Uint8Array(8)
	globalThis.crypto.getRandomValues(bytes)
	return Array.from(bytes, b => b.toString(16).padStart(2, '0')).join('')
}

/**
 * One channel: an outgoing stream (open), an incoming one (accept), or both (a pair).
 * `name`, `metadata` (the creation metadata object: ours when we opened it, the peer's
 * otherwise), `readable` (a ReadableStream of Uint8Array, or null on a send-only stream),
 * `sent` (bytes handed to the WebSocket so far), `received` (bytes that arrived so far).
 */
export class Channel {
	constructor(session, name) {
		this.session = session
		this.name = name
		this.metadata = null
		this.readable = null
		this.sent = 0
		this.received = 0
		this._out = null
		this._in = null
		this._writable = null
	}

	/**
	 * Send `data` (Uint8Array, ArrayBuffer or string) in chunks of at most the announced
	 * chunkSize, each as soon as the peer's credit allows. Resolves once every chunk went to
	 * the WebSocket; rejects if the stream is cancelled, ended or the session ends.
	 * Writes are sent in the order they were made.
	 */
	write(data) {
		const bytes = toBytes(data, 'write')
		return this._queue(() => this._write(bytes))
	}

	/** Finish our stream (STREAM_END) after the pending writes; the incoming half stays open. */
	end() {
		const out = this._out
		if (out && out.ending) return out.ending
		const ending = this._queue(() => {
			out.ended = true
			this.session._send(this.session._codes.END, out.id, null)
			this.session._freeOut(this)
		})
		if (out) out.ending = ending
		return ending
	}

	/** end(), and stop reading: an incoming half that has not ended is cancelled. Never rejects. */
	close() {
		if (this._in && !this._in.ended && !this._in.error) this._cancelIn('closed')
		return this._out ? this.end().catch(() => {}) : Promise.resolve()
	}

	/** Abort at once, both halves: CANCEL_RECEIVE on ours (STREAM_END in the legacy numbering), CANCEL_SEND on theirs. */
	cancel(reason = 'cancelled') {
		const out = this._out
		if (out && !out.ended && !out.error) {
			const { format, _codes: codes } = this.session
			this._failOut(new OmnistreamsError(`${format}: stream ${JSON.stringify(this.name)} was cancelled (${reason})`, 'cancelled'))
			try {
				this.session._send(codes.CANCEL_RECEIVE ?? codes.END, out.id, null)
			} catch {
				// the session is gone already
			}
			this.session._freeOut(this)
		}
		if (this._in && !this._in.ended && !this._in.error) this._cancelIn(reason)
	}

	/** A WritableStream over write() / end() / cancel(), e.g. `file.stream().pipeTo(ch.writable)`. */
	get writable() {
		if (!this._out) return null
		this._writable ??= new WritableStream({
			write: chunk => this.write(chunk),
			close: () => this.end(),
			abort: reason => this.cancel(String(reason)),
		})
		return this._writable
	}

	/** Bytes that arrived and were not read yet (at most the window). */
	get buffered() {
		return this._in ? this._in.queue.reduce((n, chunk) => n + chunk.length, 0) : 0
	}

	/** Messages the peer still lets us send (0 while its window is full). */
	get credit() {
		return this._out ? this._out.credit : 0
	}

	// -- writing ---------------------------------------------------------------------------

	_queue(job) {
		const out = this._out
		if (!out) return Promise.reject(new OmnistreamsError(`${this.session.format}: stream ${JSON.stringify(this.name)} is receive-only (omnistreams streams are one-way; openPair() gives both ways)`, 'usage'))
		const run = async () => {
			if (out.error) throw out.error
			if (out.ended) throw new OmnistreamsError(`${this.session.format}: cannot write on ${JSON.stringify(this.name)} after end()`, 'closed')
			return job()
		}
		const result = out.tail.then(run, run)
		out.tail = result.catch(() => {})
		return result
	}

	async _write(bytes) {
		const out = this._out
		const chunk = this.session.chunkSize
		for (let off = 0; off < bytes.length; ) {
			while (out.credit === 0 && !out.error) await new Promise(resolve => (out.wake = resolve))
			if (out.error) throw out.error
			const n = Math.min(chunk, bytes.length - off)
			this.session._send(this.session._codes.DATA, out.id, bytes.subarray(off, off + n))
			out.credit--
			off += n
			this.sent += n
		}
	}

	_onCredit(count) {
		const out = this._out
		out.credit += count
		if (out.wake) {
			out.wake()
			out.wake = null
		}
	}

	_failOut(error) {
		const out = this._out
		if (!out || out.error || out.ended) return
		out.error = error
		if (out.wake) out.wake()
	}

	// -- reading ---------------------------------------------------------------------------

	_attachIn(id, chunk, raw) {
		const window = Math.min(MAX_GRANT, Math.max(1, Math.floor(this.session.window / chunk)))
		const state = { id, chunk, window, credit: 0, batch: Math.max(1, window >> 2), consumed: 0, queue: [], ended: false, error: null, wake: null, controller: null }
		this._in = state
		this.rawMetadata = raw // the peer's creation metadata as sent
		this.readable = new ReadableStream(
			{
				start: controller => void (state.controller = controller),
				pull: controller => this._pull(controller),
				cancel: () => this._cancelIn('the reader cancelled'),
			},
			{ highWaterMark: 0 }, // pull() runs only for a waiting read: credit follows reading
		)
		this._grant(window)
	}

	_grant(count) {
		const state = this._in
		state.credit += count
		for (let left = count; left > 0; left -= 255) {
			this.session._send(this.session._codes.REQUEST_DATA, state.id, [Math.min(255, left)])
		}
	}

	_onData(payload) {
		const state = this._in
		if (payload.length > state.chunk) throw this.session._protocol(`STREAM_DATA of ${payload.length} bytes on stream ${state.id} exceeds its chunkSize ${state.chunk}`)
		if (state.credit <= 0) throw this.session._protocol(`STREAM_DATA beyond the credit on stream ${state.id} (${state.window} messages requested)`)
		state.credit--
		this.received += payload.length
		if (!payload.length) return this._consumed()
		state.queue.push(payload)
		this._wakeIn()
	}

	async _pull(controller) {
		const state = this._in
		while (!state.queue.length && !state.ended && !state.error) await new Promise(resolve => (state.wake = resolve))
		if (state.queue.length) {
			controller.enqueue(state.queue.shift())
			if (!state.ended && !state.error) this._consumed()
		} else if (state.error) {
			throw state.error
		} else {
			controller.close()
		}
	}

	_consumed() {
		const state = this._in
		if (++state.consumed >= state.batch) {
			const count = state.consumed
			state.consumed = 0
			try {
				this._grant(count)
			} catch {
				// the session ended: the reader learns it from the stream
			}
		}
	}

	_wakeIn() {
		const state = this._in
		if (state.wake) {
			state.wake()
			state.wake = null
		}
	}

	_endIn() {
		this._in.ended = true
		this._wakeIn()
	}

	_failIn(error) {
		const state = this._in
		if (!state || state.ended || state.error) return
		state.error = error
		this._wakeIn()
	}

	_cancelIn(reason) {
		const state = this._in
		const session = this.session
		state.queue.length = 0
		this._failIn(new OmnistreamsError(`${session.format}: reading ${JSON.stringify(this.name)} was cancelled (${reason})`, 'cancelled'))
		if (session._receivers.get(state.id) === this) {
			session._receivers.delete(state.id)
			session._cancelled.add(state.id)
			try {
				session._send(session._codes.CANCEL_SEND, state.id, null)
			} catch {
				// the session is gone already
			}
		}
		try {
			state.controller.error(state.error)
		} catch {
			// the stream is closed already
		}
	}
}
