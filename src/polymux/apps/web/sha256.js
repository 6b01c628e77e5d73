/**
 * SHA-256 (FIPS 180-4) that takes its input in pieces: the page hashes a file as it sends or
 * receives it (crypto.subtle.digest wants the whole input at once, and exists only in secure
 * contexts). `new Sha256().update(bytes).update(more).hex()`.
 */

const K = Int32Array.from([
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
].map(x => x | 0))

export class Sha256 {
	constructor() {
		this.h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19])
		this.w = new Int32Array(64)
		this.block = new Uint8Array(64)
		this.used = 0 // bytes in `block`
		this.length = 0 // bytes hashed so far
	}

	/** Hash `bytes` (a Uint8Array) after what came before; returns this. */
	update(bytes) {
		let pos = 0
		this.length += bytes.length
		if (this.used) {
			const n = Math.min(64 - this.used, bytes.length)
			this.block.set(bytes.subarray(0, n), this.used)
			this.used += n
			pos = n
			if (this.used < 64) return this
			this._compress(this.block, 0)
			this.used = 0
		}
		for (; pos + 64 <= bytes.length; pos += 64) this._compress(bytes, pos)
		if (pos < bytes.length) {
			this.block.set(bytes.subarray(pos), 0)
			this.used = bytes.length - pos
		}
		return this
	}

	/** A copy that goes on independently (for the digest of a prefix, say). */
	clone() {
		const copy = new Sha256()
		copy.h.set(this.h)
		copy.block.set(this.block)
		copy.used = this.used
		copy.length = this.length
		return copy
	}

	/** The digest as 64 hex digits (the object cannot be updated after this). */
	hex() {
		const bits = this.length * 8
		const tail = new Uint8Array(this.used < 56 ? 64 - this.used : 128 - this.used)
		tail[0] = 0x80
		const view = new DataView(tail.buffer)
		view.setUint32(tail.length - 8, Math.floor(bits / 2 ** 32))
		view.setUint32(tail.length - 4, bits >>> 0)
		this.length -= tail.length // update() counts the padding: undo it
		this.update(tail)
		return Array.from(this.h, x => x.toString(16).padStart(8, '0')).join('')
	}

	_compress(bytes, at) {
		// Plain locals and int32 arithmetic: several times faster in V8 than array destructuring.
		const w = this.w
		const h = this.h
		for (let i = 0; i < 16; i++, at += 4) {
			w[i] = (bytes[at] << 24) | (bytes[at + 1] << 16) | (bytes[at + 2] << 8) | bytes[at + 3]
		}
		for (let i = 16; i < 64; i++) {
			const x = w[i - 15]
			const y = w[i - 2]
			const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3)
			const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10)
			w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0
		}
		let a = h[0] | 0
		let b = h[1] | 0
		let c = h[2] | 0
		let d = h[3] | 0
		let e = h[4] | 0
		let f = h[5] | 0
		let g = h[6] | 0
		let k = h[7] | 0
		for (let i = 0; i < 64; i++) {
			const s1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))
			const t1 = (k + s1 + ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0
			const s0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))
			const t2 = (s0 + ((a & b) ^ (a & c) ^ (b & c))) | 0
			k = g
			g = f
			f = e
			e = (d + t1) | 0
			d = c
			c = b
			b = a
			a = (t1 + t2) | 0
		}
		h[0] += a
		h[1] += b
		h[2] += c
		h[3] += d
		h[4] += e
		h[5] += f
		h[6] += g
		h[7] += k
	}
}
