/**
 * The web chat page: one WebSocket (omnistreams, polymux's omnistreams.js), one channel pair
 * per room and per file transfer. Rooms speak the records of the terminal chat client, so
 * terminals and browsers meet in the same rooms; uploads speak the file-transfer records of
 * examples/filetransfer (offer, accept, start, bytes, end {sha256}, done); downloads ask for
 * a file (get) and get it back with its SHA-256 (file, bytes, end). See polymux.apps.webchat.
 *
 * `?nick=ada&room=lobby,dev` joins at once. `window.webchat` holds the state (for the console).
 */

import { connect } from '/polymux/omnistreams.js'
import { RecordReader, encodeRecord } from './records.js'
import { Sha256 } from './sha256.js'

const SLICE = 256 * 1024 // bytes per write of an upload: the bar moves at least this finely
const $ = selector => document.querySelector(selector)

const state = { session: null, rooms: new Map(), active: null, transfers: [] }
window.webchat = state

function element(tag, props = {}, ...children) {
	const node = document.createElement(tag)
	for (const [key, value] of Object.entries(props)) {
		if (key.startsWith('data-') || key.startsWith('aria-')) node.setAttribute(key, value)
		else node[key] = value
	}
	node.append(...children)
	return node
}

function mib(n) {
	return (n / 1048576).toFixed(n < 10485760 ? 2 : 1)
}

function setStatus(text, kind) {
	const status = $('#status')
	status.textContent = text
	status.dataset.state = kind
}

// -- connection -------------------------------------------------------------------------------

async function start() {
	const url = new URL('/ws', location.href)
	url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:'
	try {
		state.session = await connect(url.href)
	} catch (error) {
		setStatus(`cannot connect: ${error.message}`, 'error')
		return
	}
	setStatus(`connected to ${url.host}`, 'ok')
	state.session.closed.then(({ error }) => setStatus(error ? `disconnected: ${error.message}` : 'disconnected', 'error'))
	refreshFiles()
	const params = new URLSearchParams(location.search)
	if (params.get('nick')) {
		$('#nick').value = params.get('nick')
		for (const room of (params.get('room') || 'lobby').split(',')) await join(room.trim())
	}
}

// -- chat -------------------------------------------------------------------------------------

async function join(room) {
	const nick = $('#nick').value.trim()
	if (!room || !nick) return
	$('#notice').textContent = ''
	if (state.rooms.has(room)) return select(room)
	const list = element('ol', { 'data-room': room })
	const view = { room, nick, list, channel: null, tab: null, pending: new Map() }
	try {
		const channel = await session().openPair(`chat/${room}`)
		await channel.write(encodeRecord({ type: 'join', room, nick }))
		const reader = new RecordReader(channel.readable)
		const welcome = await reader.record()
		if (!welcome || welcome.type !== 'welcome') {
			channel.close()
			throw new Error(welcome ? welcome.message || `unexpected ${welcome.type}` : 'the server closed the channel')
		}
		view.channel = channel
		view.tab = element('button', { type: 'button', role: 'tab', 'data-room': room }, `#${room}`, element('span', { className: 'leave', title: 'leave' }, '×'))
		view.tab.addEventListener('click', event => (event.target.classList.contains('leave') ? leave(room) : select(room)))
		$('#rooms').append(view.tab)
		$('#messages').append(list)
		state.rooms.set(room, view)
		notice(view, `joined #${room} as ${nick}; members: ${welcome.members.join(', ')}`)
		select(room)
		readRoom(view, reader)
	} catch (error) {
		alertLine(`cannot join #${room}: ${error.message}`)
	}
}

async function readRoom(view, reader) {
	try {
		for (;;) {
			const record = await reader.record()
			if (!record) return notice(view, 'the server closed the room')
			if (record.type === 'msg') message(view, record)
			else if (record.type === 'joined') notice(view, `${record.nick} joined`)
			else if (record.type === 'left') notice(view, `${record.nick} left (${record.reason})`)
			else if (record.type === 'dropped') notice(view, `the server dropped ${record.count} messages for us (too slow)`)
			else if (record.type === 'error') notice(view, `error: ${record.message}`)
		}
	} catch (error) {
		if (state.rooms.get(view.room) === view) notice(view, `disconnected: ${error.message}`)
	}
}

function message(view, record) {
	const own = record.nick === view.nick
	const item = element('li', { className: own ? 'msg own' : 'msg', 'data-nick': record.nick, 'data-seq': record.seq }, element('span', { className: 'nick' }, record.nick), record.text)
	const sent = own ? view.pending.get(record.text) : undefined
	if (sent !== undefined) {
		view.pending.delete(record.text)
		item.dataset.rttMs = (performance.now() - sent).toFixed(1) // said -> back from the server
	}
	append(view, item)
}

function notice(view, text) {
	append(view, element('li', { className: 'notice' }, text))
}

function alertLine(text) {
	$('#notice').textContent = text
}

function append(view, item) {
	const box = $('#messages')
	const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 4
	view.list.append(item)
	if (atEnd) box.scrollTop = box.scrollHeight
}

function select(room) {
	state.active = room
	for (const view of state.rooms.values()) {
		view.list.hidden = view.room !== room
		view.tab.setAttribute('aria-selected', String(view.room === room))
	}
	$('#text').disabled = $('#say button').disabled = !state.rooms.size
	$('#text').placeholder = state.rooms.size ? `message #${room}` : 'join a room, then type here'
	$('#text').focus()
}

async function say(text) {
	const view = state.rooms.get(state.active)
	if (!view || !text) return
	view.pending.set(text, performance.now())
	try {
		await view.channel.write(encodeRecord({ type: 'say', text }))
	} catch (error) {
		notice(view, `not sent: ${error.message}`)
	}
}

async function leave(room) {
	const view = state.rooms.get(room)
	if (!view) return
	state.rooms.delete(room)
	view.tab.remove()
	view.list.remove()
	const next = state.rooms.keys().next()
	if (!next.done) select(next.value)
	else select(null)
	try {
		await view.channel.write(encodeRecord({ type: 'leave' }))
	} catch {
		// the channel is gone already: nothing to say
	}
	view.channel.close()
}

// -- file transfers ---------------------------------------------------------------------------

class Transfer {
	constructor(kind, name, size) {
		Object.assign(this, { kind, name, size, done: 0, from: 0, state: 'starting', paused: false, cancelled: false, channel: null })
		this.started = performance.now()
		this.resume = null
		this.bar = element('progress', { max: Math.max(size, 1), value: 0 })
		this.info = element('span', { className: 'info' }, 'starting…')
		this.pause = element('button', { type: 'button', className: 'pause' }, 'pause')
		this.stop = element('button', { type: 'button', className: 'cancel' }, 'cancel')
		this.pause.addEventListener('click', () => this.toggle())
		this.stop.addEventListener('click', () => this.cancel())
		const arrow = kind === 'upload' ? '↑' : '↓'
		this.row = element('li', { className: 'transfer', 'data-kind': kind, 'data-name': name, 'data-state': 'starting' }, element('div', {}, `${arrow} ${name} `, this.pause, ' ', this.stop), this.bar, this.info)
		$('#transfers').prepend(this.row)
		state.transfers.push(this)
	}

	/** Resolves at once unless paused; then when resumed. Throws once cancelled. */
	async gate() {
		while (this.paused && !this.cancelled) await new Promise(resolve => (this.resume = resolve))
		if (this.cancelled) throw new Error('cancelled by the user')
	}

	cancel() {
		this.cancelled = true
		this.channel?.cancel('cancelled by the user') // fails a read or write in progress
		this.resume?.() // and a paused transfer
	}

	toggle() {
		this.paused = !this.paused
		this.pause.textContent = this.paused ? 'resume' : 'pause'
		this.row.dataset.paused = String(this.paused)
		if (!this.paused && this.resume) this.resume()
		this.show()
	}

	begin(size, from = 0) {
		this.size = size
		this.from = this.done = from
		this.bar.max = Math.max(size, 1)
		this.t0 = performance.now()
		this.state = 'running'
		this.progress(from)
	}

	progress(done) {
		this.done = done
		this.bar.value = done
		this.row.dataset.done = done
		this.row.dataset.state = this.state
		this.show()
	}

	rate() {
		const seconds = ((this.finished ?? performance.now()) - (this.t0 ?? this.started)) / 1000
		return seconds > 0 ? (this.done - this.from) / seconds / 1e6 : 0
	}

	show(extra = '') {
		const rate = this.state === 'running' || this.state === 'done' ? ` · ${this.rate().toFixed(1)} MB/s` : ''
		const paused = this.paused ? ' · paused' : ''
		this.info.textContent = `${mib(this.done)} of ${mib(this.size)} MiB${rate}${paused}${extra}`
	}

	finish(sha256, note = '') {
		this.finished = performance.now()
		this.state = 'done'
		this.sha256 = sha256
		Object.assign(this.row.dataset, { state: 'done', done: this.done, sha256, ms: (this.finished - this.t0).toFixed(1), mbps: this.rate().toFixed(2) })
		this.pause.remove()
		this.stop.remove()
		this.show(` · SHA-256 ${sha256.slice(0, 12)}… verified${note}`)
	}

	fail(error) {
		this.finished = performance.now()
		this.state = 'failed'
		this.error = error.message
		Object.assign(this.row.dataset, { state: 'failed', error: error.message })
		this.pause.remove()
		this.stop.remove()
		this.channel?.cancel('failed')
		this.info.textContent = `failed: ${error.message}`
	}
}

async function* blobChunks(blob) {
	const reader = blob.stream().getReader()
	for (;;) {
		const { value, done } = await reader.read()
		if (done) return
		yield value
	}
}

/** The session, or an error that says why there is none. */
function session() {
	if (!state.session || state.session.error) throw new Error(state.session ? state.session.error.message : 'not connected')
	return state.session
}

function expect(record, type, what) {
	if (!record) throw new Error(`the server closed the channel ${what}`)
	if (record.type === 'error') throw new Error(record.message)
	if (record.type !== type) throw new Error(`expected ${type}, got ${record.type}`)
	return record
}

/** Upload `file` on its own channel (the records of examples/filetransfer). */
async function upload(file) {
	const t = new Transfer('upload', file.name, file.size)
	try {
		const channel = (t.channel = await session().openPair('files/put'))
		await channel.write(encodeRecord({ type: 'offer', name: file.name, size: file.size }))
		const reader = new RecordReader(channel.readable)
		const accept = expect(await reader.record(), 'accept', 'without an answer')
		let sha = new Sha256()
		let from = 0
		if (accept.offset > 0 && accept.offset <= file.size) {
			// The server holds a part (an interrupted upload) or the whole file: send the rest only if it is ours.
			t.info.textContent = 'checking what the server has…'
			for await (const chunk of blobChunks(file.slice(0, accept.offset))) sha.update(chunk)
			if (sha.clone().hex() === accept.prefix_sha256) from = accept.offset
			else sha = new Sha256()
		}
		await channel.write(encodeRecord({ type: 'start', offset: from }))
		t.begin(file.size, from)
		let sent = from
		for await (const chunk of blobChunks(file.slice(from))) {
			sha.update(chunk)
			for (let off = 0; off < chunk.length; off += SLICE) {
				await t.gate()
				const piece = chunk.subarray(off, off + SLICE)
				await channel.write(piece) // resolves once the server's credit let it through
				sent += piece.length
				t.progress(sent)
			}
		}
		if (sent !== file.size) throw new Error(`the file changed while being sent (${sent} of ${file.size} bytes)`)
		const digest = sha.hex()
		await channel.write(encodeRecord({ type: 'end', sha256: digest }))
		await channel.end()
		const done = expect(await reader.record(), 'done', 'before confirming')
		if (done.sha256 !== digest) throw new Error(`the server got SHA-256 ${done.sha256}, we sent ${digest}`)
		channel.close()
		t.finish(digest, from ? ` (resumed at ${mib(from)} MiB)` : '')
		refreshFiles()
	} catch (error) {
		t.fail(error)
	}
}

/** Download `name` on its own channel, check its SHA-256, then save it. */
async function download(name) {
	const t = new Transfer('download', name, 0)
	try {
		const channel = (t.channel = await session().openPair('files/get'))
		await channel.write(encodeRecord({ type: 'get', name }))
		await channel.end()
		const reader = new RecordReader(channel.readable)
		const head = expect(await reader.record(), 'file', 'without an answer')
		t.begin(head.size)
		const sha = new Sha256()
		const parts = []
		for await (const chunk of reader.bytes(head.size)) {
			sha.update(chunk)
			parts.push(chunk)
			t.progress(t.done + chunk.length)
			await t.gate() // paused: we stop reading, so the server gets no credit and stops
		}
		const end = expect(await reader.record(), 'end', 'before the checksum')
		const digest = sha.hex()
		if (end.sha256 !== digest) throw new Error(`SHA-256 mismatch: the server sent ${end.sha256}, we got ${digest}`)
		channel.close()
		const url = URL.createObjectURL(new Blob(parts))
		t.finish(digest)
		const save = element('a', { href: url, download: name.split('/').pop(), className: 'save' }, 'save again')
		t.row.append(' ', save)
		save.click()
	} catch (error) {
		t.fail(error)
	}
}

async function refreshFiles() {
	try {
		const channel = await session().openPair('files/list')
		await channel.write(encodeRecord({ type: 'list' }))
		await channel.end()
		const answer = expect(await new RecordReader(channel.readable).record(), 'files', 'without an answer')
		channel.close()
		$('#listing').replaceChildren(
			...answer.files.map(file => {
				const link = element('a', { href: '#', className: 'get', 'data-name': file.name, title: 'download' }, file.name)
				link.addEventListener('click', event => {
					event.preventDefault()
					download(file.name)
				})
				return element('li', { 'data-name': file.name, 'data-size': file.size }, link, ` (${mib(file.size)} MiB)`)
			}),
		)
	} catch (error) {
		$('#listing').replaceChildren(element('li', { className: 'error' }, `cannot list: ${error.message}`))
	}
}

// -- wiring -----------------------------------------------------------------------------------

$('#join').addEventListener('submit', event => {
	event.preventDefault()
	join($('#room').value.trim())
})
$('#say').addEventListener('submit', event => {
	event.preventDefault()
	const text = $('#text').value
	$('#text').value = ''
	say(text)
})
$('#pick').addEventListener('change', event => {
	for (const file of event.target.files) upload(file)
	event.target.value = ''
})
// Files dropped anywhere on the page are uploaded (the browser would otherwise open them).
const drop = $('#drop')
window.addEventListener('dragover', event => {
	event.preventDefault()
	drop.classList.add('over')
})
window.addEventListener('dragleave', event => {
	if (!event.relatedTarget) drop.classList.remove('over')
})
window.addEventListener('drop', event => {
	event.preventDefault()
	drop.classList.remove('over')
	for (const file of event.dataTransfer.files) upload(file)
})
$('#refresh').addEventListener('click', refreshFiles)

Object.assign(state, { join, say, leave, upload, download, refreshFiles })
start()
