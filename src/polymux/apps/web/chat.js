/**
 * The web chat page: one WebSocket (omnistreams, polymux's omnistreams.js), one channel pair
 * per room and per file transfer. Rooms speak the records of the terminal chat client, so
 * terminals and browsers meet in the same rooms; uploads speak the file-transfer records of
 * examples/filetransfer (offer, accept, start, bytes, end {sha256}, done); downloads ask for
 * a file (get {name, offset}) and get it back with its SHA-256 (file, bytes, end); the file
 * list is live (files/watch). See polymux.apps.webchat and polymux.apps.chat.
 *
 * The connection comes back by itself (backoff 0.5 s to 15 s, "Retry now" at any time): the
 * rooms are joined again, with the messages said meanwhile (the server keeps each room's
 * recent ones), and transfers go on from where the server is. The nick and the rooms of
 * this tab survive a reload (sessionStorage).
 *
 * `?nick=ada&room=lobby,dev` joins at once. `window.webchat` holds the state (for the console
 * and the tests).
 */

import { connect } from '/polymux/omnistreams.js'
import { MAX_RECORD, RecordReader, encodeRecord } from './records.js'
import { Sha256 } from './sha256.js'

const SLICE = 256 * 1024 // bytes per write of an upload: the bar moves at least this finely
const MAX_TEXT = 16384 // characters per message (the server's limit, counted as it counts them)
const MAX_LABEL = 64 // characters of a nick or a room name
const HISTORY = 100 // recent messages asked for when joining a room
const BACKOFF = [500, 1000, 2000, 4000, 8000, 15000] // ms before each new attempt to connect
const TITLE = document.title
const $ = selector => document.querySelector(selector)

const state = {
	session: null, // the connected Session, or null
	everConnected: false,
	attempt: 0, // failed connection attempts in a row
	retryAt: 0,
	timer: null,
	connecting: false,
	online: [], // resolvers of waitOnline()
	nick: '',
	rooms: new Map(), // room -> view
	active: null,
	transfers: [],
	files: [],
	watching: false,
}
window.webchat = state

// -- small helpers ----------------------------------------------------------------------------

function element(tag, props = {}, ...children) {
	const node = document.createElement(tag)
	for (const [key, value] of Object.entries(props)) {
		if (key.startsWith('data-') || key.startsWith('aria-') || key === 'role') node.setAttribute(key, value)
		else node[key] = value
	}
	node.append(...children.filter(child => child !== null && child !== undefined))
	return node
}

/** A byte count for people: 512 B, 12.5 KiB, 3.40 MiB, 1.2 GiB. */
export function formatBytes(n) {
	if (n < 1024) return `${n} B`
	const units = ['KiB', 'MiB', 'GiB', 'TiB']
	let value = n / 1024
	let unit = 0
	while (value >= 1024 && unit < units.length - 1) {
		value /= 1024
		unit++
	}
	return `${value.toFixed(value < 10 ? 2 : 1)} ${units[unit]}`
}

const count = n => n.toLocaleString('en-US')
const short = (text, n = 16) => (characters(text) > n ? `${[...text].slice(0, n - 1).join('')}…` : text)
const characters = text => [...text].length // code points, as Python's len() counts them

function clock(seconds) {
	const date = seconds ? new Date(seconds * 1000) : new Date()
	const today = new Date().toDateString() === date.toDateString()
	const time = date.toLocaleTimeString([], { hour: 'numeric', minute: '2-digit' })
	const shown = today ? time : `${date.toLocaleDateString([], { day: 'numeric', month: 'short' })} ${time}`
	return element('time', { dateTime: date.toISOString(), title: date.toLocaleString() }, shown)
}

/** What went wrong, in words a person uses (the technical message stays in the console). */
function plain(error) {
	if (!error) return 'something went wrong'
	console.debug('webchat:', error)
	if (error.name === 'OmnistreamsError') {
		if (error.code === 'closed') return 'the connection to the server was lost'
		if (error.code === 'cancelled') return 'it was cancelled'
		if (error.code === 'timeout') return 'the server did not answer in time'
		if (error.code === 'protocol') return 'the server sent something this page cannot read'
		if (error.code === 'limit') return 'too many transfers at once: wait for some to finish'
	}
	if (error.name === 'RecordError') return 'the server sent something this page cannot read'
	return error.message
}

/** Why a nick or a room name cannot be used, or '' (the server checks the same). */
function labelProblem(what, value) {
	if (!value) return `Type a ${what} first.`
	if (characters(value) > MAX_LABEL) return `A ${what} has at most ${MAX_LABEL} characters (this one has ${characters(value)}).`
	if ([...value].some(c => c !== ' ' && /[\p{C}\p{Z}]/u.test(c))) return `A ${what} cannot contain tabs, line breaks or other invisible characters.`
	return ''
}

function delay(ms) {
	return new Promise(resolve => setTimeout(resolve, ms))
}

// -- the connection ---------------------------------------------------------------------------

function setStatus(kind, text, retry = false) {
	$('#status').dataset.state = kind
	$('#status-text').textContent = text
	$('#retry').hidden = !retry
}

function wsUrl() {
	const url = new URL('/ws', location.href)
	url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:'
	return url.href
}

/** The session, or an error saying there is none (a connection loss: transfers wait). */
function session() {
	if (!state.session || state.session.error) throw Object.assign(new Error('not connected to the server'), { code: 'closed' })
	return state.session
}

/** Resolves once connected (at once if connected now). */
function waitOnline() {
	if (state.session && !state.session.error) return Promise.resolve()
	return new Promise(resolve => state.online.push(resolve))
}

async function connectNow() {
	clearTimeout(state.timer)
	state.timer = null
	if (state.connecting || state.session) return
	state.connecting = true
	setStatus('connecting', state.everConnected ? 'Reconnecting…' : 'Connecting…')
	let opened
	try {
		opened = await connect(wsUrl())
	} catch (error) {
		state.connecting = false
		console.debug('webchat: cannot connect', error)
		return scheduleReconnect()
	}
	state.connecting = false
	state.session = opened
	state.attempt = 0
	const again = state.everConnected
	state.everConnected = true
	setStatus('ok', 'Connected')
	opened.closed.then(() => lost(opened))
	setOnline(true)
	watchFiles(opened)
	for (const resolve of state.online.splice(0)) resolve()
	for (const view of state.rooms.values()) if (view.state === 'waiting') enter(view, { again })
}

function lost(gone) {
	if (state.session !== gone) return
	state.session = null
	setOnline(false)
	for (const view of state.rooms.values()) {
		if (view.state === 'joined' || view.state === 'joining') {
			view.state = 'waiting'
			view.channel = null
			notice(view, 'Connection lost. You will be back in the room once it returns.', 'bad')
			drawTab(view)
		}
	}
	drawComposer()
	scheduleReconnect()
}

function scheduleReconnect() {
	const wait = BACKOFF[Math.min(state.attempt, BACKOFF.length - 1)] * (0.8 + Math.random() * 0.4)
	state.attempt++
	state.retryAt = Date.now() + wait
	clearTimeout(state.timer)
	state.timer = setTimeout(connectNow, wait)
	countdown()
}

function countdown() {
	if (state.session || state.connecting || !state.timer) return
	const seconds = Math.max(1, Math.ceil((state.retryAt - Date.now()) / 1000))
	const what = state.everConnected ? 'Connection lost' : 'Cannot reach the server'
	setStatus('offline', `${what}. Trying again in ${seconds} s.`, true)
	setTimeout(countdown, Math.min(1000, Math.max(50, state.retryAt - Date.now())))
}

function setOnline(online) {
	document.body.classList.toggle('offline', !online)
	$('#join-button').disabled = !online
	$('#pick').disabled = !online
	$('#refresh').disabled = !online
	drawComposer()
}

// -- rooms ------------------------------------------------------------------------------------

function makeView(room) {
	const view = {
		room,
		nick: state.nick,
		state: 'new', // joining, joined, waiting (for the connection), closed (by the server), left
		reason: '',
		channel: null,
		members: new Set(),
		seen: new Set(), // msg keys shown (history comes again after a reconnect)
		unread: 0,
		pending: new Map(), // text -> performance.now() when said (round trip)
		list: element('ol', { 'data-room': room, hidden: true }),
		mark: null, // where history goes: before the notice of the latest join
	}
	const name = element('span', { className: 'name' }, `#${room}`)
	view.badge = element('span', { className: 'badge', 'aria-label': 'unread messages' })
	view.select = element('button', { type: 'button', className: 'select', role: 'tab', title: `#${room}` }, name, view.badge)
	view.leave = element('button', { type: 'button', className: 'leave', title: `Leave #${room}`, 'aria-label': `Leave #${room}` }, '×')
	view.select.addEventListener('click', () => select(room, true))
	view.leave.addEventListener('click', () => leave(room))
	view.tab = element('div', { className: 'tab', 'data-room': room }, view.select, view.leave)
	return view
}

function drawTab(view) {
	view.tab.classList.toggle('closed', view.state === 'closed')
	view.tab.classList.toggle('waiting', view.state === 'waiting')
	view.badge.textContent = view.unread ? String(view.unread) : ''
	view.select.title = view.state === 'closed' ? `#${view.room}: closed (${view.reason})` : `#${view.room}`
	const unread = [...state.rooms.values()].reduce((n, v) => n + v.unread, 0)
	document.title = unread ? `(${unread}) ${TITLE}` : TITLE
}

function drawComposer() {
	const view = state.rooms.get(state.active)
	const ready = Boolean(view && view.state === 'joined' && state.session)
	$('#text').disabled = !ready
	$('#send').disabled = !ready || !$('#text').value.trim()
	let hint = 'join a room, then type here'
	if (view && !state.session) hint = 'not connected…'
	else if (view && view.state === 'closed') hint = `#${short(view.room, 14)} is closed: Rejoin`
	else if (view && view.state === 'joined') hint = `message #${short(view.room, 14)}`
	else if (view) hint = `joining #${short(view.room, 14)}…`
	$('#text').placeholder = hint
}

function drawMembers() {
	const view = state.rooms.get(state.active)
	$('#people').hidden = !view || view.state !== 'joined'
	if (!view) return
	const names = [...view.members].sort((a, b) => a.localeCompare(b))
	$('#people-title').textContent = `In #${view.room} (${names.length})`
	$('#members').replaceChildren(
		...names.map(nick => element('li', { className: nick === view.nick ? 'me' : '', 'data-nick': nick }, nick === view.nick ? `${nick} (you)` : nick)),
	)
}

/** Join `room` (the form, a link, a reload), or go back to it if it was closed. */
async function join(room) {
	const existing = state.rooms.get(room)
	if (existing && existing.state !== 'closed') return select(room, true)
	const view = existing ?? makeView(room)
	if (!existing) {
		state.rooms.set(room, view)
		$('#rooms').append(view.tab)
		$('#messages').append(view.list)
	}
	select(room, true)
	view.focus = true // a person asked: the message box is next
	return enter(view, { again: Boolean(existing) })
}

/** Open the room's channel, send the join, read the welcome: the view is live again. */
async function enter(view, { again = false } = {}) {
	const { room } = view
	const ticket = (view.ticket = {}) // the latest attempt wins
	view.state = 'joining'
	drawTab(view)
	drawComposer()
	let channel = null
	try {
		channel = await session().openPair(`chat/${room}`)
		await channel.write(encodeRecord({ type: 'join', room, nick: state.nick, history: HISTORY }))
		const reader = new RecordReader(channel.readable)
		const welcome = await reader.record()
		if (!welcome || welcome.type !== 'welcome') {
			channel.close()
			throw Object.assign(new Error(welcome ? welcome.message || `unexpected ${welcome.type}` : 'the server closed the room'), { refused: true })
		}
		if (state.rooms.get(room) !== view || view.ticket !== ticket) return void channel.close() // left, or tried again, meanwhile
		view.channel = channel
		view.retries = 0
		view.lastError = ''
		view.nick = welcome.nick
		view.members = new Set(welcome.members)
		view.state = 'joined'
		const others = welcome.members.filter(nick => nick !== welcome.nick)
		const here = others.length ? `with ${others.join(', ')}` : 'nobody else is here yet'
		view.mark = notice(view, again ? `You are back in #${room} as ${welcome.nick}, ${here}.` : `You joined #${room} as ${welcome.nick}; ${here}.`)
		view.mark.classList.add('joined')
		drawTab(view)
		if (state.active === room) {
			drawComposer()
			drawMembers()
			const focus = document.activeElement
			if (view.focus || !focus || focus === document.body) $('#text').focus()
			view.focus = false
		}
		save()
		readRoom(view, channel, reader)
	} catch (error) {
		if (state.rooms.get(room) !== view || view.ticket !== ticket) return
		if (!error.refused && (error.code === 'closed' || !state.session)) {
			view.state = 'waiting' // the connection went: joined again when it is back
			drawTab(view)
			drawComposer()
			return
		}
		const why = error.refused ? error.message : plain(error)
		if (error.refused && / is taken /.test(why) && (again || view.restored) && (view.retries ?? 0) < 6) {
			// Our previous connection (before a reload or a cut) may still hold the nick for a
			// few seconds, until the server notices it is gone: try again.
			view.retries = (view.retries ?? 0) + 1
			view.state = 'waiting'
			if (view.retries === 1) notice(view, `The server still holds ${state.nick} for your previous connection; trying again…`)
			drawTab(view)
			setTimeout(() => {
				if (state.rooms.get(room) === view && view.ticket === ticket && state.session) enter(view, { again })
			}, 1500 * view.retries)
			return
		}
		if (!again && !view.list.children.length) {
			forget(view) // never joined: no tab; the form says why
			alertLine(`cannot join #${room}: ${why}`)
		} else {
			closeRoom(view, why)
		}
	}
}

async function readRoom(view, channel, reader) {
	try {
		for (;;) {
			const record = await reader.record()
			if (view.channel !== channel) return
			if (!record) return closeRoom(view, view.lastError || 'the server closed the room')
			onRecord(view, record)
		}
	} catch (error) {
		if (view.channel !== channel) return
		if (channel.session.error) return // the connection went: lost() takes it from here
		closeRoom(view, error.code === 'cancelled' ? 'the server removed you from the room (this page could not keep up)' : plain(error))
	}
}

function onRecord(view, record) {
	switch (record.type) {
		case 'msg':
			return message(view, record)
		case 'file':
			return fileNotice(view, record)
		case 'joined':
			view.members.add(record.nick)
			notice(view, `${record.nick} joined`)
			break
		case 'left': {
			view.members.delete(record.nick)
			const why = record.reason === 'left' || !record.reason ? '' : record.reason === 'connection lost' ? ' (connection lost)' : `: ${record.reason}`
			notice(view, `${record.nick} left${why}`)
			break
		}
		case 'renamed':
			view.members.delete(record.old)
			view.members.add(record.nick)
			if (record.old === view.nick) {
				view.nick = record.nick
				view.renaming = false
				view.nickRefusal = ''
				notice(view, `You are now ${record.nick}.`)
				nickChanged()
			} else {
				notice(view, `${record.old} is now ${record.nick}`)
			}
			break
		case 'dropped':
			notice(view, `The server skipped ${record.count} messages for this page (it fell behind).`, 'bad')
			break
		case 'error':
			if (record.refused === 'say') notice(view, `Not sent: ${record.message}.`, 'bad')
			else if (record.refused === 'nick') {
				view.renaming = false
				view.nickRefusal = record.message
				notice(view, `Your nick stays ${view.nick} here: ${record.message}.`, 'bad')
				nickChanged()
			} else if (record.closing) view.lastError = record.message // the reason of the close that follows
			else notice(view, `The server says: ${record.message}`, 'bad')
			break
	}
	if (state.active === view.room) {
		drawMembers()
		drawComposer()
	}
}

/** The server closed the room (or refused a join again): the tab stays, with the reason. */
function closeRoom(view, reason) {
	view.channel?.cancel('closed')
	view.channel = null
	view.state = 'closed'
	view.reason = reason
	const rejoin = element('button', { type: 'button', className: 'rejoin' }, 'Rejoin')
	rejoin.addEventListener('click', () => join(view.room))
	const item = notice(view, `#${view.room} is closed: ${reason}.`, 'closed')
	item.querySelector('.body').append(rejoin)
	drawTab(view)
	if (state.active === view.room) {
		drawComposer()
		drawMembers()
	}
	save()
}

function messageKey(record) {
	return `${record.seq}/${record.ts}`
}

function message(view, record) {
	const key = messageKey(record)
	if (view.seen.has(key)) return // history we have shown already (a reconnect)
	view.seen.add(key)
	const own = record.nick === view.nick
	const item = element(
		'li',
		{ className: `msg${own ? ' own' : ''}${record.history ? ' history' : ''}`, 'data-nick': record.nick, 'data-seq': record.seq },
		clock(record.ts),
		element('span', { className: 'body' }, element('span', { className: 'nick' }, record.nick), element('span', { className: 'text' }, record.text)),
	)
	const sent = own ? view.pending.get(record.text) : undefined
	if (sent !== undefined) {
		view.pending.delete(record.text)
		item.dataset.rttMs = (performance.now() - sent).toFixed(1) // said -> back from the server
	}
	place(view, item, record.history)
	if (!own && !record.history) bump(view)
}

function fileNotice(view, record) {
	const key = messageKey(record)
	if (view.seen.has(key)) return
	view.seen.add(key)
	const mine = record.nick === view.nick
	const get = mine ? null : element('button', { type: 'button', className: 'get', 'data-name': record.name }, 'Download')
	get?.addEventListener('click', () => download(record.name))
	const who = mine ? 'You' : record.nick
	const item = element(
		'li',
		{ className: 'notice file', 'data-name': record.name },
		clock(record.ts),
		element('span', { className: 'body' }, element('span', { className: 'text' }, `${who} put ${record.name} (${formatBytes(record.size)}) on the server`), get),
	)
	place(view, item, record.history)
	if (record.nick !== view.nick && !record.history) bump(view)
}

function notice(view, text, kind = '') {
	const item = element('li', { className: `notice ${kind}`.trim() }, clock(), element('span', { className: 'body' }, element('span', { className: 'text' }, text)))
	place(view, item, false)
	return item
}

/** A line under the form: `topic` 'join' (joins refused, input refused) or 'nick' (renaming). */
function alertLine(text, kind = 'bad', topic = 'join') {
	let line = $(`#notice [data-topic="${topic}"]`)
	if (!line) {
		line = element('span', { 'data-topic': topic })
		$('#notice').append(line)
	}
	line.textContent = text
	line.className = kind
}

/** Add `item` to the room; history goes before the latest join notice. Keeps the view at the bottom if it was there. */
function place(view, item, history) {
	const box = $('#messages')
	const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 8
	if (history && view.mark && view.mark.parentNode === view.list) view.list.insertBefore(item, view.mark)
	else view.list.append(item)
	if (atEnd && state.active === view.room) box.scrollTop = box.scrollHeight
}

function bump(view) {
	if (state.active === view.room && !document.hidden) return
	view.unread++
	drawTab(view)
}

function select(room, focus = false) {
	state.active = room
	$('#empty').hidden = state.rooms.size > 0
	for (const view of state.rooms.values()) {
		const on = view.room === room
		view.list.hidden = !on
		view.tab.setAttribute('aria-current', String(on))
		view.select.setAttribute('aria-selected', String(on))
		if (on) view.unread = 0
		drawTab(view)
	}
	drawComposer()
	drawMembers()
	const box = $('#messages')
	box.scrollTop = box.scrollHeight
	if (focus && !$('#text').disabled) $('#text').focus()
	save()
}

async function leave(room) {
	const view = state.rooms.get(room)
	if (!view) return
	forget(view)
	const next = state.rooms.keys().next()
	select(next.done ? null : next.value, true)
	const channel = view.channel
	view.channel = null
	view.state = 'left'
	if (!channel) return
	try {
		await channel.write(encodeRecord({ type: 'leave' }))
	} catch {
		// the channel is gone already: nothing to say
	}
	channel.close()
}

function forget(view) {
	state.rooms.delete(view.room)
	view.tab.remove()
	view.list.remove()
	if (state.active === view.room) state.active = null
	$('#empty').hidden = state.rooms.size > 0
	drawComposer()
	drawMembers()
	save()
}

// -- saying things ----------------------------------------------------------------------------

/** Why `text` cannot be sent as a message, or '' (too long: offered as a file instead). */
function tooLong(text) {
	const n = characters(text)
	if (n > MAX_TEXT) return `This message has ${count(n)} characters; a message has at most ${count(MAX_TEXT)}.`
	if (encodeRecord({ type: 'say', text }).length - 4 > MAX_RECORD) return `This message is too large to send (${formatBytes(new TextEncoder().encode(text).length)}).`
	return ''
}

function sayHint(text, kind = '', action = null) {
	const hint = $('#say-hint')
	hint.replaceChildren(text)
	hint.className = kind
	if (action) hint.append(action)
}

function checkDraft() {
	const text = $('#text').value
	const problem = text.length > MAX_TEXT / 2 ? tooLong(text) : ''
	if (problem) {
		const asFile = element('button', { type: 'button', className: 'as-file' }, 'Send as a file')
		asFile.addEventListener('click', () => {
			const stamp = new Date().toISOString().slice(0, 19).replaceAll(':', '-')
			upload(new File([$('#text').value], `message-${stamp}.txt`, { type: 'text/plain' }))
			$('#text').value = ''
			checkDraft()
		})
		sayHint(problem, 'bad', asFile)
	} else if ($('#say-hint').classList.contains('bad')) {
		sayHint('')
	}
	fitText()
	drawComposer()
}

function fitText() {
	const text = $('#text')
	text.style.height = 'auto'
	text.style.height = `${Math.min(text.scrollHeight + 2, 160)}px`
	text.style.overflowY = text.scrollHeight + 2 > 160 ? 'auto' : 'hidden'
}

async function say(text) {
	const view = state.rooms.get(state.active)
	if (!view || view.state !== 'joined' || !text.trim()) return false
	const problem = tooLong(text)
	if (problem) {
		checkDraft()
		return false
	}
	view.pending.set(text, performance.now())
	try {
		await view.channel.write(encodeRecord({ type: 'say', text }))
		return true
	} catch (error) {
		view.pending.delete(text)
		notice(view, `Not sent (${plain(error)}): ${text.length > 80 ? `${text.slice(0, 80)}…` : text}`, 'bad')
		return false
	}
}

// -- the nick ---------------------------------------------------------------------------------

/** The nick typed in the form; it applies to every room joined (renamed there). */
function setNick(nick) {
	if (nick === state.nick) return
	state.nick = nick
	localStorage.setItem('polymux-webchat-nick', nick)
	const joined = [...state.rooms.values()].filter(view => view.state === 'joined' && view.nick !== nick)
	if (joined.length) alertLine(`Changing your nick to ${nick} in ${joined.map(v => `#${v.room}`).join(', ')}…`, 'info', 'nick')
	for (const view of joined) {
		view.renaming = true
		view.channel.write(encodeRecord({ type: 'nick', nick })).catch(() => (view.renaming = false))
	}
	save()
}

/** Once every room answered a rename: say how it went; refused everywhere, the old nick stays. */
function nickChanged() {
	const joined = [...state.rooms.values()].filter(view => view.state === 'joined')
	if (joined.some(view => view.renaming)) return
	const stuck = joined.filter(view => view.nick !== state.nick)
	const where = views => views.map(v => `#${v.room}`).join(', ')
	if (!stuck.length) {
		alertLine(joined.length ? `You are ${state.nick} in ${where(joined)}.` : '', 'info', 'nick')
	} else if (stuck.length === joined.length && new Set(stuck.map(v => v.nick)).size === 1) {
		const why = stuck.map(v => v.nickRefusal).find(Boolean) || `${state.nick} cannot be used`
		state.nick = stuck[0].nick
		$('#nick').value = state.nick
		localStorage.setItem('polymux-webchat-nick', state.nick)
		save()
		alertLine(`Your nick stays ${state.nick}: ${why}.`, 'bad', 'nick')
	} else {
		const why = stuck.map(v => `${v.nick} in #${v.room}${v.nickRefusal ? ` (${v.nickRefusal})` : ''}`).join(', ')
		alertLine(`You are ${state.nick} in ${where(joined.filter(v => !stuck.includes(v)))}, but still ${why}.`, 'bad', 'nick')
	}
	drawComposer()
	drawMembers()
}

// -- keeping this tab's rooms across a reload ---------------------------------------------------

function save() {
	const rooms = [...state.rooms.values()].filter(v => v.state !== 'closed').map(v => v.room)
	sessionStorage.setItem('polymux-webchat', JSON.stringify({ nick: state.nick, rooms, active: state.active }))
}

function restore() {
	const params = new URLSearchParams(location.search)
	if (params.get('nick')) return { nick: params.get('nick').trim(), rooms: (params.get('room') || 'lobby').split(',').map(r => r.trim().replace(/^#/, '')).filter(Boolean), active: null }
	try {
		const saved = JSON.parse(sessionStorage.getItem('polymux-webchat') || 'null')
		if (saved && typeof saved.nick === 'string') return saved
	} catch {
		// nothing usable saved
	}
	return { nick: localStorage.getItem('polymux-webchat-nick') || '', rooms: [], active: null }
}

// -- file transfers ---------------------------------------------------------------------------

class Transfer {
	constructor(kind, name, size) {
		Object.assign(this, { kind, name, size, done: 0, from: 0, state: 'starting', paused: false, cancelled: false, channel: null })
		this.moved = 0 // bytes moved by this page (not those the other side had already)
		this.activeMs = 0 // time spent moving bytes (not paused, not waiting)
		this.since = null
		this.samples = [] // [time, done] of the last seconds: the speed shown
		this.wake = null
		this.bar = element('progress', { max: Math.max(size, 1), value: 0 })
		this.info = element('div', { className: 'info' }, 'starting…')
		this.pause = element('button', { type: 'button', className: 'pause' }, 'Pause')
		this.stop = element('button', { type: 'button', className: 'cancel' }, 'Cancel')
		this.pause.addEventListener('click', () => this.toggle())
		this.stop.addEventListener('click', () => this.cancel())
		const arrow = kind === 'upload' ? '↑' : '↓'
		this.title = element('span', { className: 'name', title: name }, `${arrow} ${name}`)
		this.row = element('li', { className: 'transfer', 'data-kind': kind, 'data-name': name, 'data-state': 'starting' }, element('div', { className: 'row' }, this.title, this.pause, this.stop), this.bar, this.info)
		$('#transfers').prepend(this.row)
		state.transfers.push(this)
		drawTransfers()
	}

	get finished() {
		return ['done', 'failed', 'cancelled'].includes(this.state)
	}

	/** Count the time spent moving bytes (called at each change of state). */
	tick() {
		const now = performance.now()
		if (this.since !== null) this.activeMs += now - this.since
		this.since = this.state === 'running' && !this.paused ? now : null
	}

	setState(value) {
		this.tick()
		this.state = value
		this.tick()
		this.row.dataset.state = value
	}

	/** Resolves at once unless paused or cancelled; then when resumed. Throws once cancelled. */
	async gate() {
		while (this.paused && !this.cancelled) await new Promise(resolve => (this.wake = resolve))
		if (this.cancelled) throw Object.assign(new Error('cancelled'), { cancelled: true })
	}

	cancel() {
		this.cancelled = true
		this.channel?.cancel('cancelled by the user') // fails a read or write in progress
		this.wake?.() // and a paused or waiting transfer
	}

	toggle() {
		this.paused = !this.paused
		this.tick()
		this.samples = []
		this.pause.textContent = this.paused ? 'Resume' : 'Pause'
		this.row.dataset.paused = String(this.paused)
		if (!this.paused) this.wake?.()
		this.show()
	}

	begin(size, from) {
		this.size = size
		this.from = from
		this.done = from
		this.bar.max = Math.max(size, 1)
		if (from) this.row.dataset.resumedFrom = from
		this.samples = []
		this.setState('running')
		this.progress(from)
	}

	progress(done) {
		this.moved += Math.max(0, done - this.done)
		this.done = done
		this.bar.value = done
		this.row.dataset.done = done
		const now = performance.now()
		this.samples.push([now, done])
		while (this.samples.length > 2 && now - this.samples[0][0] > 3000) this.samples.shift()
		this.show()
	}

	speed() {
		if (this.samples.length < 2) return null
		const [t0, d0] = this.samples[0]
		const [t1, d1] = this.samples[this.samples.length - 1]
		return t1 - t0 > 200 ? (d1 - d0) / (t1 - t0) / 1000 : null // MB/s
	}

	show(extra = '') {
		const of = `${formatBytes(this.done)} of ${formatBytes(this.size)}`
		let text = of
		if (this.state === 'waiting') text = `${of} · waiting for the connection`
		else if (this.paused) text = `${of} · paused`
		else if (this.state === 'running') {
			const speed = this.speed()
			if (speed !== null) text = `${of} · ${speed.toFixed(1)} MB/s`
		}
		this.info.textContent = text + extra
	}

	waiting() {
		this.setState('waiting')
		this.show()
	}

	finish(sha256, note = '') {
		this.setState('done')
		this.sha256 = sha256
		const mbps = this.activeMs > 0 ? this.moved / this.activeMs / 1000 : 0
		Object.assign(this.row.dataset, { done: this.done, sha256, ms: this.activeMs.toFixed(1), mbps: mbps.toFixed(2) })
		this.end()
		const speed = this.moved >= 1 << 20 ? ` · ${mbps.toFixed(1)} MB/s` : ''
		this.info.textContent = `${formatBytes(this.size)} · SHA-256 ${sha256.slice(0, 12)}… verified${speed}${note}`
	}

	fail(error) {
		const why = error.refusal ?? plain(error)
		this.setState('failed')
		this.error = error.message
		this.row.dataset.error = error.message
		this.end()
		this.channel?.cancel('failed')
		this.info.textContent = `Failed: ${why}`
	}

	cancelled_() {
		this.setState('cancelled')
		this.end()
		this.info.textContent = `Cancelled at ${formatBytes(this.done)} of ${formatBytes(this.size)}`
	}

	end() {
		this.pause.remove()
		this.stop.remove()
		drawTransfers()
	}

	/** Run `attempt` until it succeeds; a lost connection waits for the next and goes on. */
	async run(attempt) {
		let busy = 0
		for (;;) {
			try {
				await attempt()
				return
			} catch (error) {
				if (this.cancelled || error.cancelled) return this.cancelled_()
				if (error.restart && busy++ < 5) continue
				if (error.code === 'closed' || !state.session) {
					this.channel = null
					this.waiting()
					await Promise.race([waitOnline(), new Promise(resolve => (this.wake = resolve))])
					if (this.cancelled) return this.cancelled_()
					continue
				}
				if (error.code === 'busy' && busy++ < 5) {
					// The server still holds our previous attempt (its connection has not timed out yet).
					this.waiting()
					await delay(1000 * busy)
					continue
				}
				return this.fail(error)
			}
		}
	}
}

function drawTransfers() {
	const any = state.transfers.length > 0
	$('#transfers-head').hidden = !any
	$('#clear').hidden = !state.transfers.some(t => t.finished)
}

function clearFinished() {
	for (const t of state.transfers.filter(t => t.finished)) {
		t.row.remove()
		if (t.url) URL.revokeObjectURL(t.url)
	}
	state.transfers = state.transfers.filter(t => !t.finished)
	drawTransfers()
}

async function* blobChunks(blob) {
	const reader = blob.stream().getReader()
	for (;;) {
		const { value, done } = await reader.read()
		if (done) return
		yield value
	}
}

function expect(record, type, what) {
	if (!record) throw new Error(`the server closed the channel ${what}`)
	if (record.type === 'error') throw Object.assign(new Error(record.message), { code: record.code, refusal: `the server refused: ${record.message}` })
	if (record.type !== type) throw new Error(`expected ${type}, got ${record.type}`)
	return record
}

/** Upload `file` on its own channel (the records of examples/filetransfer); resumed after a lost connection. */
function upload(file) {
	const t = new Transfer('upload', file.name, file.size)
	t.file = file
	return t.run(async () => {
		const channel = (t.channel = await session().openPair('files/put'))
		const view = state.rooms.get(state.active)
		const where = view && view.state === 'joined' ? { room: view.room, nick: view.nick } : {}
		await channel.write(encodeRecord({ type: 'offer', name: file.name, size: file.size, ...where }))
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
		const note = from === file.size ? ' · it was on the server already' : from ? ` · resumed at ${formatBytes(from)}` : ''
		t.finish(digest, note)
	})
}

/** Download `name` on its own channel, check its SHA-256, then save it; resumed after a lost connection. */
function download(name) {
	if (!state.session) return alertLine('Not connected: the download can start once the connection is back.')
	const t = new Transfer('download', name, 0)
	let parts = []
	let sha = new Sha256()
	let have = 0
	return t.run(async () => {
		const channel = (t.channel = await session().openPair('files/get'))
		await channel.write(encodeRecord({ type: 'get', name, offset: have }))
		await channel.end()
		const reader = new RecordReader(channel.readable)
		const head = expect(await reader.record(), 'file', 'without an answer')
		const offset = head.offset ?? 0
		if (offset !== have || (have && head.size !== t.size)) {
			// The server starts elsewhere (it changed, or does not resume): from the start.
			parts = []
			sha = new Sha256()
			have = 0
			if (offset !== 0) {
				channel.cancel('restart')
				throw Object.assign(new Error('the file changed on the server'), { restart: true })
			}
		}
		t.begin(head.size, offset)
		for await (const chunk of reader.bytes(head.size - offset)) {
			sha.update(chunk)
			parts.push(chunk)
			have += chunk.length
			t.progress(have)
			await t.gate() // paused: we stop reading, so the server gets no credit and stops
		}
		const end = expect(await reader.record(), 'end', 'before the checksum')
		const digest = sha.clone().hex()
		if (end.sha256 !== digest) throw new Error(`SHA-256 mismatch: the server sent ${end.sha256}, we got ${digest}`)
		channel.close()
		t.url = URL.createObjectURL(new Blob(parts))
		parts = []
		t.finish(digest, offset ? ` · resumed at ${formatBytes(offset)}` : '')
		const save = element('a', { href: t.url, download: name.split('/').pop(), className: 'save' }, 'Save again')
		t.row.querySelector('.row').append(save)
		save.click()
	})
}

// -- the list of files on the server ------------------------------------------------------------

function showFiles(answer) {
	const before = state.listed ? new Set(state.files.map(f => f.name)) : null
	state.files = answer.files
	state.listed = true
	const rows = answer.files.map(file => {
		const link = element('a', { href: '#', className: 'get', 'data-name': file.name, title: `Download ${file.name}` }, element('span', { className: 'name' }, file.name), element('span', { className: 'size' }, formatBytes(file.size)))
		link.addEventListener('click', event => {
			event.preventDefault()
			download(file.name)
		})
		const fresh = before !== null && !before.has(file.name) // new since the list was last shown
		return element('li', { 'data-name': file.name, 'data-size': file.size, className: fresh ? 'fresh' : '' }, link)
	})
	if (!rows.length) rows.push(element('li', { className: 'empty' }, 'No files yet: drop one on the page.'))
	if (answer.truncated) rows.push(element('li', { className: 'empty' }, `Showing the first ${answer.files.length} files.`))
	$('#listing').replaceChildren(...rows)
}

/** The live file list: the server sends it now and after every upload, until the connection goes. */
async function watchFiles(current) {
	try {
		const channel = await current.openPair('files/watch')
		await channel.write(encodeRecord({ type: 'watch' }))
		const reader = new RecordReader(channel.readable)
		for (;;) {
			const answer = await reader.record()
			if (!answer || answer.type !== 'files') break
			showFiles(answer)
		}
		channel.close()
	} catch (error) {
		if (current.error) return // the connection went: watched again on the next one
		console.debug('webchat: no live file list', error)
	}
	if (!current.error) await refreshFiles() // a server without files/watch: the list as it is now
}

async function refreshFiles() {
	try {
		const channel = await session().openPair('files/list')
		await channel.write(encodeRecord({ type: 'list' }))
		await channel.end()
		const answer = expect(await new RecordReader(channel.readable).record(), 'files', 'without an answer')
		channel.close()
		showFiles(answer)
	} catch (error) {
		$('#listing').replaceChildren(element('li', { className: 'error' }, `Cannot list the files: ${plain(error)}.`))
	}
}

// -- wiring -----------------------------------------------------------------------------------

$('#join').addEventListener('submit', event => {
	event.preventDefault()
	const nick = $('#nick').value.trim()
	const room = $('#room').value.trim().replace(/^#/, '')
	$('#nick').value = nick
	$('#room').value = room
	const problem = labelProblem('nick', nick) || labelProblem('room name', room)
	if (problem) {
		alertLine(problem)
		;(labelProblem('nick', nick) ? $('#nick') : $('#room')).focus()
		return
	}
	alertLine('')
	setNick(nick)
	join(room)
})
$('#nick').addEventListener('change', () => {
	const nick = $('#nick').value.trim()
	const joined = [...state.rooms.values()].some(view => view.state === 'joined')
	if (!joined || nick === state.nick) return
	const problem = labelProblem('nick', nick)
	if (problem) return alertLine(`${problem} Your nick stays ${state.nick}.`, 'bad', 'nick')
	setNick(nick)
})
$('#say').addEventListener('submit', async event => {
	event.preventDefault()
	const text = $('#text').value
	if (!text.trim()) return
	if (tooLong(text)) return checkDraft()
	$('#text').value = ''
	checkDraft()
	if (!(await say(text)) && !$('#text').value) {
		$('#text').value = text // not sent: keep it for another try
		checkDraft()
	}
})
$('#text').addEventListener('input', checkDraft)
$('#text').addEventListener('keydown', event => {
	if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
		event.preventDefault()
		$('#say').requestSubmit()
	}
})
$('#retry').addEventListener('click', () => {
	state.attempt = 0
	connectNow()
})
window.addEventListener('online', () => connectNow())
document.addEventListener('visibilitychange', () => {
	if (document.hidden) return
	const view = state.rooms.get(state.active)
	if (view) {
		view.unread = 0
		drawTab(view)
	}
	if (!state.session && state.timer) connectNow()
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
	if (!state.session) return alertLine('Not connected: drop the files again once the connection is back.')
	for (const file of event.dataTransfer.files) upload(file)
})
$('#refresh').addEventListener('click', refreshFiles)
$('#clear').addEventListener('click', clearFinished)

Object.assign(state, { join, say, leave, upload, download, refreshFiles, connectNow, formatBytes })

function start() {
	const saved = restore()
	state.nick = saved.nick || ''
	$('#nick').value = state.nick
	setOnline(false)
	select(null)
	for (const room of saved.rooms || []) {
		if (labelProblem('room name', room) || state.rooms.has(room)) continue
		const view = makeView(room)
		view.state = 'waiting'
		view.restored = true
		state.rooms.set(room, view)
		$('#rooms').append(view.tab)
		$('#messages').append(view.list)
	}
	if (state.rooms.size) select(saved.active && state.rooms.has(saved.active) ? saved.active : state.rooms.keys().next().value)
	if (state.rooms.size && labelProblem('nick', state.nick)) {
		alertLine(labelProblem('nick', state.nick))
		for (const view of [...state.rooms.values()]) forget(view)
	}
	;(state.nick ? $('#text') : $('#nick')).focus()
	if (state.nick && !state.rooms.size) $('#room').focus()
	connectNow()
}

start()
