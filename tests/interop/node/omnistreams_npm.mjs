/*
 * Helpers for peers that drive the npm package `omnistreams` 0.9.0 (omnistreams_peer.mjs,
 * webclient_peer.mjs): reading a Producer within the credit it requests, writing to a
 * Consumer within the demand it was told (the package's sender ignores credit by itself).
 */

/** Read a producer to its end, keeping `window` messages requested; resolves the bytes. */
export function readAll(producer, { window = 16, onChunk = null } = {}) {
	return new Promise((resolve, reject) => {
		const parts = []
		producer.onData(data => {
			const chunk = Buffer.from(data.buffer, data.byteOffset, data.byteLength)
			parts.push(Buffer.from(chunk))
			if (onChunk && onChunk(parts) === false) return
			producer.request(1)
		})
		producer.onEnd(() => resolve(Buffer.concat(parts)))
		producer.onTermination(() => reject(new Error('terminated')))
		producer.request(window)
	})
}

/** Write `buf` to a consumer in `chunk` pieces, never beyond the demand it was given.
 * Resolves 'ended' after end(), or 'terminated' if the peer cancelled. */
export function writeWithinCredit(consumer, buf, { chunk = 65536, end = true, endless = false } = {}) {
	return new Promise(resolve => {
		let demand = 0
		let offset = 0
		let done = false
		consumer.onTermination(() => {
			if (!done) {
				done = true
				resolve('terminated')
			}
		})
		const pump = () => {
			while (!done && demand > 0 && (endless || offset < buf.length)) {
				const start = endless ? 0 : offset
				const piece = buf.subarray(start, Math.min(start + chunk, buf.length))
				consumer.write(new Uint8Array(piece.buffer, piece.byteOffset, piece.byteLength))
				offset += piece.length
				demand--
			}
			if (!done && !endless && offset >= buf.length) {
				done = true
				if (end) consumer.end()
				resolve('ended')
			}
		}
		consumer.onRequest(n => {
			demand += n
			pump()
		})
	})
}
