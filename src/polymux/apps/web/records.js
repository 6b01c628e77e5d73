/**
 * The records of polymux.apps.records in the browser: a msgpack map preceded by its length
 * (4 bytes, big-endian, at most 64 KiB), and raw bytes after a record on the same channel.
 * msgpack: the subset the chat and the file transfer use (nil, booleans, integers, floats,
 * strings, binary, arrays, maps); anything else is an error naming the type byte.
 */

export const MAX_RECORD = 64 * 1024

const utf8 = new TextEncoder()
const fromUtf8 = new TextDecoder('utf-8', { fatal: true })

export class RecordError extends Error {
	constructor(message) {
		super(`record: ${message}`)
		this.name = 'RecordError'
	}
}

// -- msgpack ---------------------------------------------------------------------------------

function encodeValue(value, out) {
	if (value === null || value === undefined) return out.push(0xc0)
	if (value === false || value === true) return out.push(value ? 0xc3 : 0xc2)
	if (typeof value === 'number') return encodeNumber(value, out)
	if (typeof value === 'string') {
		const bytes = utf8.encode(value)
		const n = bytes.length
		if (n < 32) out.push(0xa0 | n)
		else if (n < 0x100) out.push(0xd9, n)
		else if (n < 0x10000) out.push(0xda, n >> 8, n & 0xff)
		else out.push(0xdb, ...be32(n))
		for (const b of bytes) out.push(b)
		return
	}
	if (value instanceof Uint8Array) {
		const n = value.length
		if (n < 0x100) out.push(0xc4, n)
		else if (n < 0x10000) out.push(0xc5, n >> 8, n & 0xff)
		else out.push(0xc6, ...be32(n))
		for (const b of value) out.push(b)
		return
	}
	if (Array.isArray(value)) {
		header(value.length, 0x90, 0xdc, out)
		for (const item of value) encodeValue(item, out)
		return
	}
	if (typeof value === 'object') {
		const entries = Object.entries(value).filter(([, v]) => v !== undefined)
		header(entries.length, 0x80, 0xde, out)
		for (const [key, item] of entries) {
			encodeValue(key, out)
			encodeValue(item, out)
		}
		return
	}
	throw new RecordError(`cannot encode a ${typeof value}`)
}

function header(n, fix, wide, out) {
	if (n < 16) out.push(fix | n)
	else if (n < 0x10000) out.push(wide, n >> 8, n & 0xff)
	else out.push(wide + 1, ...be32(n))
}

function be32(n) {
	return [(n >>> 24) & 0xff, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff]
}

function encodeNumber(n, out) {
	if (Number.isSafeInteger(n)) {
		if (n >= 0 && n < 0x80) return out.push(n)
		if (n < 0 && n >= -32) return out.push(n & 0xff)
		if (n >= 0 && n <= 0xffffffff) return out.push(0xce, ...be32(n))
		const view = new DataView(new ArrayBuffer(9))
		view.setUint8(0, n >= 0 ? 0xcf : 0xd3)
		view.setBigInt64(1, BigInt(n))
		return out.push(...new Uint8Array(view.buffer))
	}
	const view = new DataView(new ArrayBuffer(9))
	view.setUint8(0, 0xcb)
	view.setFloat64(1, n)
	out.push(...new Uint8Array(view.buffer))
}

class Decoder {
	constructor(bytes) {
		this.bytes = bytes
		this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
		this.pos = 0
	}

	take(n) {
		if (this.pos + n > this.bytes.length) throw new RecordError('msgpack value cut short')
		const at = this.pos
		this.pos += n
		return at
	}

	value() {
		const t = this.bytes[this.take(1)]
		const v = this.view
		if (t < 0x80) return t
		if (t >= 0xe0) return t - 0x100
		if (t >= 0x80 && t <= 0x8f) return this.map(t & 0x0f)
		if (t >= 0x90 && t <= 0x9f) return this.array(t & 0x0f)
		if (t >= 0xa0 && t <= 0xbf) return this.str(t & 0x1f)
		switch (t) {
			case 0xc0: return null
			case 0xc2: return false
			case 0xc3: return true
			case 0xc4: return this.bin(this.bytes[this.take(1)])
			case 0xc5: return this.bin(v.getUint16(this.take(2)))
			case 0xc6: return this.bin(v.getUint32(this.take(4)))
			case 0xca: return v.getFloat32(this.take(4))
			case 0xcb: return v.getFloat64(this.take(8))
			case 0xcc: return this.bytes[this.take(1)]
			case 0xcd: return v.getUint16(this.take(2))
			case 0xce: return v.getUint32(this.take(4))
			case 0xcf: return Number(v.getBigUint64(this.take(8)))
			case 0xd0: return v.getInt8(this.take(1))
			case 0xd1: return v.getInt16(this.take(2))
			case 0xd2: return v.getInt32(this.take(4))
			case 0xd3: return Number(v.getBigInt64(this.take(8)))
			case 0xd9: return this.str(this.bytes[this.take(1)])
			case 0xda: return this.str(v.getUint16(this.take(2)))
			case 0xdb: return this.str(v.getUint32(this.take(4)))
			case 0xdc: return this.array(v.getUint16(this.take(2)))
			case 0xdd: return this.array(v.getUint32(this.take(4)))
			case 0xde: return this.map(v.getUint16(this.take(2)))
			case 0xdf: return this.map(v.getUint32(this.take(4)))
		}
		throw new RecordError(`unsupported msgpack type byte 0x${t.toString(16)}`)
	}

	str(n) {
		const at = this.take(n)
		try {
			return fromUtf8.decode(this.bytes.subarray(at, at + n))
		} catch {
			throw new RecordError('a msgpack string is not valid UTF-8')
		}
	}

	bin(n) {
		const at = this.take(n)
		return this.bytes.slice(at, at + n)
	}

	array(n) {
		const items = []
		for (let i = 0; i < n; i++) items.push(this.value())
		return items
	}

	map(n) {
		const obj = {}
		for (let i = 0; i < n; i++) {
			const key = this.value()
			if (typeof key !== 'string') throw new RecordError(`map keys must be strings, got ${typeof key}`)
			obj[key] = this.value()
		}
		return obj
	}
}

/** `record` (a plain object with a string `type`) as length-prefixed msgpack. */
export function encodeRecord(record) {
	const out = [0, 0, 0, 0]
	encodeValue(record, out)
	const bytes = Uint8Array.from(out)
	new DataView(bytes.buffer).setUint32(0, bytes.length - 4)
	return bytes
}

/** A record body (without its prefix) as an object; RecordError when it is not a map with a string `type`. */
export function decodeRecord(body) {
	const decoder = new Decoder(body)
	const value = decoder.value()
	if (decoder.pos !== body.length) throw new RecordError(`${body.length - decoder.pos} bytes after the msgpack value`)
	if (!value || typeof value !== 'object' || Array.isArray(value)) throw new RecordError('expected a msgpack map')
	if (typeof value.type !== 'string') throw new RecordError(`field 'type' must be a string, got ${JSON.stringify(value.type)}`)
	return value
}

// -- reading records and bytes from a channel ----------------------------------------------

/** Reads records, and raw bytes between them, from a ReadableStream of Uint8Array. */
export class RecordReader {
	constructor(readable) {
		this.reader = readable.getReader()
		this.held = new Uint8Array(0) // read from the stream, not handed out yet
	}

	async _more() {
		const { value, done } = await this.reader.read()
		if (done) return false
		this.held = this.held.length ? concat(this.held, value) : value
		return true
	}

	/** The next record, or null at a clean end of the stream before one starts. */
	async record() {
		while (this.held.length < 4) {
			if (!(await this._more())) {
				if (!this.held.length) return null
				throw new RecordError(`the channel ended inside a length prefix (${this.held.length} of 4 bytes)`)
			}
		}
		const length = new DataView(this.held.buffer, this.held.byteOffset, 4).getUint32(0)
		if (length > MAX_RECORD) throw new RecordError(`length ${length} exceeds the limit of ${MAX_RECORD} bytes`)
		while (this.held.length < 4 + length) {
			if (!(await this._more())) throw new RecordError(`the channel ended after ${this.held.length - 4} of ${length} bytes`)
		}
		const body = this.held.subarray(4, 4 + length)
		this.held = this.held.subarray(4 + length)
		return decodeRecord(body)
	}

	/** The next `n` raw bytes, as chunks (each read only when the caller asks for it). */
	async *bytes(n) {
		while (n > 0) {
			if (!this.held.length && !(await this._more())) throw new RecordError(`the channel ended ${n} bytes early`)
			const chunk = this.held.length > n ? this.held.subarray(0, n) : this.held
			this.held = this.held.subarray(chunk.length)
			n -= chunk.length
			yield chunk
		}
	}

	cancel(reason) {
		return this.reader.cancel(reason).catch(() => {})
	}
}

function concat(a, b) {
	const out = new Uint8Array(a.length + b.length)
	out.set(a)
	out.set(b, a.length)
	return out
}
