/**
 * The web chat page: one WebSocket (omnistreams, polymux's omnistreams.js), one channel pair
 * per room and per file transfer. Rooms speak the records of the terminal chat client, so
 * terminals and browsers meet in the same rooms; uploads speak the file-transfer records of
 * examples/filetransfer (offer, accept, start, bytes, end {sha256}, done); downloads ask for
 * a file (get {name, offset}) and get it back with its SHA-256 (file, bytes, end); the file
 * list is live (files/watch). See polymux.apps.webchat and polymux.apps.chat.
 *
 * The connection comes back by itself (backoff 0.5 s to 15 s, "Retry now" at any time; a
 * connection that goes silent is noticed by a ping): the rooms are joined again and catch
 * up on what was said meanwhile, each message once and in order, marked as missed (the
 * server counts what it no longer holds); a message sent just before the connection went
 * is sent again, and the server relays it once (its id). Transfers go on from where the
 * server is. The nick and the rooms of this tab survive a reload (sessionStorage), with a
 * "New since you left" line.
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
const HISTORY = 100 // recent messages asked for when first joining a room
const BACKOFF = [500, 1000, 2000, 4000, 8000, 15000] // ms before each new attempt to connect
const TYPING_EVERY = 3000 // ms between two "typing" records we send
const TYPING_SHOWN = 6000 // ms a "typing" record of someone else shows
const TITLE = document.title
const $ = selector => document.querySelector(selector)
const coarse = matchMedia('(pointer: coarse)')

const state = {
	session: null, // the connected Session, or null
	everConnected: false,
	attempt: 0, // failed connection attempts in a row
	retryAt: 0,
	timer: null,
	connecting: false,
	online: [], // resolvers of waitOnline()
	nick: '',
	token: '', // our join token: a new channel of ours replaces the one the server may still hold
	rooms: new Map(), // room -> view
	active: null,
	transfers: [],
	files: [],
	pinned: true, // the message list shows its end (it follows new messages)
	heard: 0, // performance.now() of the last record from the server
	pinged: 0, // when we last asked (0: not waiting for an answer)
	liveness: { interval: 20000, timeout: 10000 }, // ms of silence before a ping; ms it has to answer
	touch: coarse.matches, // a phone or a tablet: Enter makes a new line, Send sends
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

function icon(paths) {
	const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg')
	for (const [k, v] of Object.entries({ viewBox: '0 0 24 24', width: 22, height: 22, fill: 'none', stroke: 'currentColor', 'stroke-width': 2, 'stroke-linecap': 'round', 'stroke-linejoin': 'round', 'aria-hidden': 'true' })) svg.setAttribute(k, v)
	svg.innerHTML = paths // constant markup of this file, never text from elsewhere
	return svg
}
const FILE_ICON = '<path d="M6 3h8l4 4v14H6z"/><path d="M14 3v4h4"/>'

/** A byte count for people, in one unit system (decimal, as MB/s): 512 B, 12.5 KB, 8.4 MB, 1.2 GB. */
export function formatBytes(n) {
	if (n < 1000) return `${n} B`
	const units = ['KB', 'MB', 'GB', 'TB']
	let value = n / 1000
	let unit = 0
	while (value >= 1000 && unit < units.length - 1) {
		value /= 1000
		unit++
	}
	return `${value.toFixed(value < 100 ? 1 : 0)} ${units[unit]}`
}

const count = n => n.toLocaleString('en-US')
const plural = (n, one, many = `${one}s`) => `${count(n)} ${n === 1 ? one : many}`
const short = (text, n = 16) => (characters(text) > n ? `${[...text].slice(0, n - 1).join('')}…` : text)
const characters = text => [...text].length // code points, as Python's len() counts them

function randomId(bytes = 8) {
	return [...crypto.getRandomValues(new Uint8Array(bytes))].map(b => b.toString(16).padStart(2, '0')).join('')
}

function when(seconds) {
	return seconds ? new Date(seconds * 1000) : new Date()
}

function hhmm(date) {
	return date.toLocaleTimeString([], { hour: 'numeric', minute: '2-digit' })
}

function clock(date) {
	return element('time', { dateTime: date.toISOString(), title: date.toLocaleString() }, hhmm(date))
}

function dayName(date) {
	const today = new Date()
	const yesterday = new Date(today.getTime() - 86400000)
	if (date.toDateString() === today.toDateString()) return 'Today'
	if (date.toDateString() === yesterday.toDateString()) return 'Yesterday'
	return date.toLocaleDateString([], { weekday: 'long', day: 'numeric', month: 'long' })
}

/** A readable colour per nick (the same in every page). */
function nickColour(nick) {
	let h = 0
	for (const c of nick) h = (h * 31 + c.codePointAt(0)) >>> 0
	return `hsl(${h % 360} 60% 32%)`
}

const URL_PATTERN = /\bhttps?:\/\/[^\s<>"]+/gi

/** `text` as text nodes and links (http and https only; never HTML from the message). */
function linkify(text) {
	const parts = []
	let at = 0
	for (const match of text.matchAll(URL_PATTERN)) {
		let url = match[0]
		// Punctuation after a link is the sentence's, and a closing bracket is only the link's if it opened one.
		while (/[.,;:!?'»”)\]]$/.test(url)) {
			const last = url.at(-1)
			if ((last === ')' && url.split('(').length > url.split(')').length - 1) || (last === ']' && url.split('[').length > url.split(']').length - 1)) break
			url = url.slice(0, -1)
		}
		let href = null
		try {
			const parsed = new URL(url)
			if (parsed.protocol === 'http:' || parsed.protocol === 'https:') href = parsed.href
		} catch {
			// not a URL after all: stays text
		}
		if (!href) continue
		parts.push(text.slice(at, match.index))
		parts.push(element('a', { href, target: '_blank', rel: 'noopener noreferrer' }, url))
		at = match.index + url.length
	}
	parts.push(text.slice(at))
	return parts.filter(part => part !== '')
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
	state.heard = performance.now()
	state.pinged = 0
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
			clearTyping(view)
			notice(view, 'Connection lost. You will be back in the room once it returns.', 'bad')
			drawTab(view)
		}
	}
	drawComposer()
	drawMembers()
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
	if (narrow()) {
		setStatus('offline', `${state.everConnected ? 'Offline' : 'No connection'}. Retrying in ${seconds} s.`, true)
	} else {
		const what = state.everConnected ? 'Connection lost' : 'Cannot reach the server'
		setStatus('offline', `${what}. Trying again in ${seconds} s.`, true)
	}
	setTimeout(countdown, Math.min(1000, Math.max(50, state.retryAt - Date.now())))
}

/** A connection can stop carrying bytes without closing (a Wi-Fi drop, a NAT that forgot
 * it): after `interval` of silence ask the server (ping), and give the connection up if
 * nothing comes within `timeout`. */
function checkLiveness() {
	const current = state.session
	const now = performance.now()
	const joined = [...state.rooms.values()].filter(view => view.state === 'joined' && view.channel)
	if (current && !current.error && joined.length) {
		if (state.pinged && state.heard < state.pinged && now - state.pinged > state.liveness.timeout) {
			console.debug('webchat: the server did not answer a ping: connecting again')
			state.pinged = 0
			current.close(4000, 'no answer to a ping')
			lost(current)
		} else if (!state.pinged && now - state.heard > state.liveness.interval) {
			state.pinged = now
			joined[0].channel.write(encodeRecord({ type: 'ping' })).catch(() => {})
		}
	}
	setTimeout(checkLiveness, Math.min(1000, state.liveness.interval / 4, state.liveness.timeout / 4))
}

function heard() {
	state.heard = performance.now()
	state.pinged = 0
}

function setOnline(online) {
	document.body.classList.toggle('offline', !online)
	$('#join-button').disabled = !online
	$('#refresh').disabled = !online
	$('#upload').disabled = !online
	for (const button of document.querySelectorAll('button.get')) button.disabled = !online
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
		epoch: null, // the room's numbering (its welcome's epoch), once joined
		last: 0, // the last number shown: a rejoin asks for what came after it
		read: 0, // the last number a person looked at (for "New since you left" after a reload)
		seen: new Set(), // `${epoch}/${seq}` shown (history comes again when a closed room is joined again)
		pending: new Map(), // our message id -> {text, item, at}: said, not yet back from the server
		typing: new Map(), // nick -> timer of someone typing here
		typedAt: 0, // when we last told the room that we are typing
		unread: 0,
		below: 0, // messages that came while the list was scrolled up (the "new messages" pill)
		belowNotices: 0, // notices that came meanwhile (the pill shows, without counting them)
		away: false, // a "New since you left" line was put for the messages coming now
		scroll: null, // the list's scroll position while another room is shown
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
	view.tab.classList.toggle('waiting', view.state === 'waiting' || view.state === 'joining')
	view.badge.textContent = view.unread ? String(view.unread) : ''
	view.select.title = view.state === 'closed' ? `#${view.room}: closed (${view.reason})` : view.state === 'waiting' ? `#${view.room}: waiting for the connection` : `#${view.room}`
	const unread = [...state.rooms.values()].reduce((n, v) => n + v.unread, 0)
	document.title = unread ? `(${unread}) ${TITLE}` : TITLE
	// The shown room's tab stays in view in the strip (the header's other parts change width).
	if (state.active === view.room) requestAnimationFrame(() => view.tab.scrollIntoView({ block: 'nearest', inline: 'nearest' }))
}

function drawComposer() {
	const view = state.rooms.get(state.active)
	const ready = Boolean(view && view.state === 'joined' && state.session)
	$('#text').disabled = !ready
	$('#attach').disabled = !state.session
	const draft = $('#text').value
	$('#send').disabled = !ready || !draft.trim() || (draft.length > MAX_TEXT / 2 && Boolean(tooLong(draft)))
	let hint = 'Message'
	if (view && !state.session) hint = 'Reconnecting…'
	else if (view && view.state === 'closed') hint = `#${short(view.room, 14)} is closed: Rejoin above`
	else if (view && view.state === 'joined') hint = `Message #${short(view.room, 14)}`
	else if (view) hint = `Joining #${short(view.room, 14)}…`
	$('#text').placeholder = hint
	$('#text').enterKeyHint = state.touch ? 'enter' : 'send'
	drawTyping()
}

function drawMembers() {
	const view = state.rooms.get(state.active)
	$('#people').hidden = !view
	$('#open-people').hidden = !view
	if (!view) return
	const names = [...view.members].sort((a, b) => a.localeCompare(b))
	const live = view.state === 'joined'
	$('#people').classList.toggle('stale', !live)
	$('#people-title').textContent = `In #${view.room} (${names.length})`
	$('#people-count').textContent = live ? String(names.length) : ''
	const note = $('#people-note')
	note.hidden = live
	note.textContent = view.state === 'closed' ? 'You are not in this room any more.' : 'Offline: who is here shows again once the connection is back.'
	$('#members').replaceChildren(
		...names.map(nick => element('li', { className: nick === view.nick ? 'me' : '', 'data-nick': nick }, nick === view.nick ? `${nick} (you)` : nick)),
	)
}

function drawTyping() {
	const view = state.rooms.get(state.active)
	const names = view && view.state === 'joined' ? [...view.typing.keys()] : []
	let text = ''
	if (names.length === 1) text = `${names[0]} is typing…`
	else if (names.length === 2) text = `${names[0]} and ${names[1]} are typing…`
	else if (names.length > 2) text = `${names[0]}, ${names[1]} and ${plural(names.length - 2, 'other')} are typing…`
	$('#typing').textContent = text
}

function clearTyping(view, nick = null) {
	for (const [who, timer] of view.typing) {
		if (nick === null || who === nick) {
			clearTimeout(timer)
			view.typing.delete(who)
		}
	}
	if (state.active === view.room) drawTyping()
}

function signedIn() {
	const any = state.rooms.size > 0
	document.body.classList.toggle('signed-out', !any)
	$('#messages').hidden = !any
	$('#say').hidden = !any
	$('#add-room').hidden = !any
	$('#me').hidden = !any
	$('#me-name').textContent = state.nick
	$('#me-initial').textContent = [...state.nick][0] ?? ''
	if (!any) closeSide()
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
		signedIn()
	}
	select(room, true)
	view.focus = true // a person asked: the message box is next
	return enter(view, { again: Boolean(existing) })
}

/** Open the room's channel, send the join, read the welcome: the view is live again. A room
 * this page was in already asks for what it missed (since its last number); a new one (or
 * after a reload) for the recent messages. */
async function enter(view, { again = false } = {}) {
	const { room } = view
	const ticket = (view.ticket = {}) // the latest attempt wins
	view.state = 'joining'
	drawTab(view)
	drawComposer()
	let channel = null
	try {
		channel = await session().openPair(`chat/${room}`)
		const join = { type: 'join', room, nick: state.nick, token: state.token }
		const catchUp = view.epoch !== null
		if (catchUp) Object.assign(join, { since: view.last, epoch: view.epoch })
		else join.history = HISTORY
		await channel.write(encodeRecord(join))
		const reader = new RecordReader(channel.readable)
		const welcome = await reader.record()
		if (!welcome || welcome.type !== 'welcome') {
			channel.close()
			throw Object.assign(new Error(welcome ? welcome.message || `unexpected ${welcome.type}` : 'the server closed the room'), { refused: true })
		}
		if (state.rooms.get(room) !== view || view.ticket !== ticket) return void channel.close() // left, or tried again, meanwhile
		heard()
		view.channel = channel
		view.retries = 0
		view.lastError = ''
		view.nick = welcome.nick
		view.members = new Set(welcome.members)
		view.state = 'joined'
		if (view.restoredEpoch !== undefined && view.restoredEpoch !== welcome.epoch) view.restoredRead = undefined
		if (!catchUp) view.last = welcome.seq ?? 0 // the history that follows is older
		else if (welcome.epoch !== view.epoch) view.last = 0 // a new numbering: all it holds is new to us
		view.epoch = welcome.epoch ?? null
		const others = welcome.members.filter(nick => nick !== welcome.nick)
		if (again || view.restored) {
			view.mark = notice(view, `You are back in #${room} as ${welcome.nick}.`)
		} else {
			const here = others.length ? `with ${others.join(', ')}` : 'nobody else is here yet'
			view.mark = notice(view, `You joined #${room} as ${welcome.nick}; ${here}.`)
		}
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
		view.catching = catchUp ? -1 : 0 // what we said is sent again once the catch-up is in
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

/** One record of the catch-up is in: after the last one, send again what is still pending. */
function caughtOne(view) {
	if (view.catching > 0 && --view.catching === 0) resend(view, view.channel)
}

/** What we said and did not see come back (the connection went meanwhile): sent again with
 * the same id once the room has caught up (what came back in the catch-up is not sent
 * again); the server relays an id once. */
async function resend(view, channel) {
	for (const [id, said] of view.pending) {
		if (view.channel !== channel) return
		try {
			await channel.write(encodeRecord({ type: 'say', text: said.text, id }))
		} catch {
			return // the connection went again: the next join sends it
		}
	}
}

async function readRoom(view, channel, reader) {
	try {
		for (;;) {
			const record = await reader.record()
			if (view.channel !== channel) return
			if (!record) return closeRoom(view, view.lastError || 'the server closed the room')
			heard()
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
			clearTyping(view, record.nick)
			return message(view, record)
		case 'file':
			return fileNotice(view, record)
		case 'catchup':
			return caughtUp(view, record)
		case 'duplicate':
			return confirmed(view, record.id, record.seq)
		case 'typing':
			if (record.nick === view.nick) return
			clearTimeout(view.typing.get(record.nick))
			view.typing.set(record.nick, setTimeout(() => clearTyping(view, record.nick), TYPING_SHOWN))
			if (state.active === view.room) drawTyping()
			return
		case 'pong':
			return
		case 'joined':
			view.members.add(record.nick)
			notice(view, `${record.nick} joined`)
			break
		case 'left': {
			view.members.delete(record.nick)
			clearTyping(view, record.nick)
			const why = record.reason === 'left' || !record.reason ? '' : record.reason === 'connection lost' ? ' (connection lost)' : `: ${record.reason}`
			notice(view, `${record.nick} left${why}`)
			break
		}
		case 'renamed':
			view.members.delete(record.old)
			view.members.add(record.nick)
			clearTyping(view, record.old)
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
			notice(view, `The server skipped ${plural(record.count, 'message')} for this page (it fell behind).`, 'bad')
			break
		case 'error':
			if (record.refused === 'say') notice(view, `Not sent: ${record.message}.`, 'bad')
			else if (record.refused === 'nick') {
				view.renaming = false
				view.nickRefusal = record.message
				notice(view, `Your nick stays ${view.nick} here: ${record.message}.`, 'bad')
				nickChanged()
			} else if (record.replaced) view.lastError = 'you joined it again in another tab or window'
			else if (record.closing) view.lastError = record.message // the reason of the close that follows
			else notice(view, `The server says: ${record.message}`, 'bad')
			break
	}
	if (state.active === view.room) {
		drawMembers()
		drawComposer()
	}
}

/** The server's summary before what we missed while the connection was away. */
function caughtUp(view, record) {
	if (record.lost === null || record.lost === undefined) {
		notice(view, 'The server restarted: what was said here just before may be lost.', 'bad')
	} else if (record.lost > 0) {
		notice(view, `${plural(record.lost, 'message')} said while you were offline ${record.lost === 1 ? 'is' : 'are'} no longer on the server.`, 'bad')
	}
	if (record.missed > 0) {
		divider(view, `${plural(record.missed, 'message')} while you were offline`, 'missed-mark')
		view.away = true // that line says it; no "New since you left" line on top
	}
	view.catching = record.missed > 0 ? record.missed : 0
	if (!view.catching) resend(view, view.channel)
}

/** The server closed the room (or refused a join again): the tab stays, with the reason. */
function closeRoom(view, reason) {
	view.channel?.cancel('closed')
	view.channel = null
	view.state = 'closed'
	view.reason = reason
	clearTyping(view)
	for (const said of view.pending.values()) {
		said.item.classList.remove('pending')
		said.item.classList.add('failed')
		said.item.querySelector('.when').textContent = 'Not sent'
	}
	view.pending.clear()
	const rejoin = element('button', { type: 'button', className: 'rejoin' }, 'Rejoin')
	rejoin.addEventListener('click', () => join(view.room))
	notice(view, `#${view.room} is closed: ${reason}.`, 'closed', rejoin)
	drawTab(view)
	if (state.active === view.room) {
		drawComposer()
		drawMembers()
	}
	save()
}

/** One message bubble: the sender and the time (shown once per minute group), the text with
 * its links, and the time on hover or tap. */
function bubble(view, { nick, own, date, body, className, data }) {
	const time = clock(date)
	const meta = element('div', { className: 'meta' }, element('span', { className: 'nick' }, own ? 'You' : nick), time)
	if (!own) meta.style.setProperty('--who', nickColour(nick))
	const side = element('span', { className: 'when' }, hhmm(date))
	const item = element(
		'li',
		{ className: `${className}${own ? ' own' : ''}`, 'data-nick': nick, 'data-minute': String(Math.floor(date.getTime() / 60000)), 'data-day': date.toDateString(), title: date.toLocaleString() },
		meta,
		element('div', { className: 'row' }, element('div', { className: 'bubble' }, body), side),
	)
	Object.assign(item.dataset, data)
	return item
}

function message(view, record) {
	showMessage(view, record)
	if (record.missed) caughtOne(view) // after: ours, confirmed, is not sent again
}

function showMessage(view, record) {
	const key = `${view.epoch}/${record.seq}`
	if (view.seen.has(key)) return // history we have shown already (a room joined again)
	if (!record.history && record.seq <= view.last) return // shown already: each message once
	view.seen.add(key)
	view.last = Math.max(view.last, record.seq)
	const own = record.nick === view.nick
	const said = own && record.id ? view.pending.get(record.id) : undefined
	if (said) {
		// Ours, back from the server: it takes its place in the room's order.
		view.pending.delete(record.id)
		const item = said.item
		item.classList.remove('pending')
		item.dataset.seq = record.seq
		item.dataset.rttMs = (performance.now() - said.at).toFixed(1) // said -> back from the server
		item.querySelector('.when').textContent = hhmm(when(record.ts))
		if (record.missed) item.classList.add('missed')
		place(view, item, { own: true })
		return
	}
	const body = element('div', { className: 'text' }, ...linkify(record.text))
	const classes = `msg${record.history ? ' history' : ''}${record.missed ? ' missed' : ''}`
	const item = bubble(view, { nick: record.nick, own, date: when(record.ts), body, className: classes, data: { seq: record.seq } })
	if (record.missed) item.title = `${item.title} · missed while you were offline`
	place(view, item, { history: record.history, fresh: !own && !record.history, seq: record.seq })
}

/** A message we said: shown at once, marked as sending until the server relays it. */
function ownBubble(view, text, id) {
	const body = element('div', { className: 'text' }, ...linkify(text))
	const item = bubble(view, { nick: view.nick, own: true, date: new Date(), body, className: 'msg pending', data: { id } })
	item.querySelector('.when').textContent = 'Sending…'
	place(view, item, { own: true })
	return item
}

/** The server relayed our message `id` already (we did not see it: the connection went). */
function confirmed(view, id, seq) {
	const said = view.pending.get(id)
	if (!said) return
	view.pending.delete(id)
	said.item.classList.remove('pending')
	said.item.dataset.seq = seq
	said.item.querySelector('.when').textContent = hhmm(new Date())
}

function fileNotice(view, record) {
	showFile(view, record)
	if (record.missed) caughtOne(view)
}

function showFile(view, record) {
	const key = `${view.epoch}/${record.seq}`
	if (view.seen.has(key)) return
	if (!record.history && record.seq <= view.last) return
	view.seen.add(key)
	view.last = Math.max(view.last, record.seq)
	const own = record.nick === view.nick
	const get = own ? null : element('button', { type: 'button', className: 'get', 'data-name': record.name, disabled: !state.session }, 'Download')
	get?.addEventListener('click', () => download(record.name))
	const body = element(
		'div',
		{ className: 'file-card' },
		element('span', { className: 'what' }, icon(FILE_ICON), element('span', { className: 'text' }, record.name)),
		element('span', { className: 'size' }, formatBytes(record.size)),
		get,
	)
	const classes = `file${record.history ? ' history' : ''}${record.missed ? ' missed' : ''}`
	const item = bubble(view, { nick: record.nick, own, date: when(record.ts), body, className: classes, data: { name: record.name, seq: record.seq } })
	item.setAttribute('aria-label', `${own ? 'You' : record.nick} shared ${record.name} (${formatBytes(record.size)})`)
	place(view, item, { history: record.history, fresh: !own && !record.history, seq: record.seq })
}

function notice(view, text, kind = '', action = null) {
	const item = element('li', { className: `notice ${kind}`.trim(), title: new Date().toLocaleString() }, clock(new Date()), element('span', { className: 'text' }, text), action)
	place(view, item)
	return item
}

function divider(view, text, kind = '') {
	view.list.querySelector(`li.divider.${kind || 'new-mark'}`)?.remove() // one of each at a time
	const item = element('li', { className: `divider ${kind || 'new-mark'}`, role: 'separator' }, text)
	place(view, item)
	return item
}

/** A line under the header: `topic` 'join' (joins refused, input refused) or 'nick' (renaming). */
function alertLine(text, kind = 'bad', topic = 'join') {
	let line = $(`#notice [data-topic="${topic}"]`)
	if (!line) {
		line = element('span', { 'data-topic': topic })
		$('#notice').append(line)
	}
	line.textContent = text
	line.className = kind
}

/** Whether a person looks at `view` now. */
function looking(view) {
	return state.active === view.room && !document.hidden
}

/**
 * Add `item` to the room: history goes before the latest join notice, the rest at the end.
 * The list follows new items only while it shows its end (or for what we said); otherwise
 * the "new messages" pill counts them. A message that comes while nobody looks gets a
 * "New since you left" line before it (one per absence).
 */
function place(view, item, { history = false, fresh = false, own = false, seq = 0 } = {}) {
	const box = $('#messages')
	const before = history && view.mark && view.mark.parentNode === view.list ? view.mark : null
	if (fresh && !looking(view) && !view.away) {
		divider(view, 'New since you left')
		view.away = true
	}
	if (history && view.restoredRead !== undefined && seq > view.restoredRead && !view.newMarked) {
		// After a reload: the first message this tab had not shown yet.
		view.newMarked = true
		const line = element('li', { className: 'divider new-mark', role: 'separator' }, 'New since you left')
		view.list.insertBefore(line, before)
	}
	const after = item.parentNode === view.list ? item.nextElementSibling : null // ours, moving to its place
	view.list.insertBefore(item, before)
	if (after) regroup(after) // what followed it may continue the run before it now
	dayLine(view, item)
	regroup(item)
	if (item.nextElementSibling) regroup(item.nextElementSibling)
	if (fresh) bump(view)
	if (state.active !== view.room) return
	if (own || state.pinned) {
		box.scrollTop = box.scrollHeight
		state.pinned = true
	} else if (fresh || item.classList.contains('notice')) {
		// Scrolled back: what comes does not move what you read (connection notices neither).
		if (fresh) view.below++
		else view.belowNotices++
		drawPill(view)
	}
	if (looking(view) && seq) view.read = Math.max(view.read, seq)
}

/** The sender and time show once per minute group: a message right after one of the same
 * sender in the same minute continues it. */
function regroup(item) {
	if (!item.dataset?.minute) return
	const previous = item.previousElementSibling
	const same = previous && previous.dataset.minute === item.dataset.minute && previous.dataset.nick === item.dataset.nick && (previous.classList.contains('msg') || previous.classList.contains('file'))
	item.classList.toggle('cont', Boolean(same))
}

/** A day's name before its first message, when it is not the previous message's day. */
function dayLine(view, item) {
	const day = item.dataset?.day
	if (!day) return
	let previous = item.previousElementSibling
	while (previous && !previous.dataset.day && !previous.classList.contains('day')) previous = previous.previousElementSibling
	if (previous?.classList.contains('day') ? previous.dataset.of === day : previous?.dataset.day === day) return
	if (!previous && day === new Date().toDateString()) return // only today's messages: no line
	const line = element('li', { className: 'day', role: 'separator', 'data-of': day }, dayName(new Date(day)))
	view.list.insertBefore(line, item)
}

function bump(view) {
	if (looking(view)) return
	view.unread++
	drawTab(view)
}

function drawPill(view) {
	const pill = $('#new-pill')
	pill.hidden = !view || view.below + view.belowNotices === 0 || state.pinned
	if (!pill.hidden) pill.textContent = view.below ? `↓ ${plural(view.below, 'new message')}` : '↓ Latest'
}

function toBottom() {
	const box = $('#messages')
	box.scrollTop = box.scrollHeight
	state.pinned = true
	const view = state.rooms.get(state.active)
	if (view) view.below = view.belowNotices = 0
	drawPill(view)
}

function onScroll() {
	const box = $('#messages')
	state.pinned = box.scrollTop + box.clientHeight >= box.scrollHeight - 24
	const view = state.rooms.get(state.active)
	if (view && state.pinned) view.below = view.belowNotices = 0
	drawPill(view)
}

function select(room, focus = false) {
	const previous = state.rooms.get(state.active)
	if (previous && previous.room !== room) {
		previous.scroll = state.pinned ? null : $('#messages').scrollTop
		previous.away = false
	}
	state.active = room
	signedIn()
	for (const view of state.rooms.values()) {
		const on = view.room === room
		view.list.hidden = !on
		view.tab.setAttribute('aria-current', String(on))
		view.select.setAttribute('aria-selected', String(on))
		if (on) {
			view.unread = 0
			view.below = view.belowNotices = 0
			if (!document.hidden) view.read = view.last
		}
		drawTab(view)
	}
	drawComposer()
	drawMembers()
	const view = state.rooms.get(room)
	const box = $('#messages')
	if (view && view.scroll !== null) {
		box.scrollTop = view.scroll
		onScroll()
	} else {
		toBottom()
	}
	if (focus && !$('#text').disabled && !state.touch) $('#text').focus()
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
	if (!state.rooms.size) ($('#room').value = room), $('#nick').focus()
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
	clearTyping(view)
	if (state.active === view.room) state.active = null
	signedIn()
	drawComposer()
	drawMembers()
	save()
}

// -- saying things ----------------------------------------------------------------------------

/** Why `text` cannot be sent as a message, or '' (too long: offered as a file instead). */
function tooLong(text) {
	const n = characters(text)
	if (n > MAX_TEXT) return `This message has ${count(n)} characters; a message has at most ${count(MAX_TEXT)}.`
	if (encodeRecord({ type: 'say', text, id: 'x'.repeat(16) }).length - 4 > MAX_RECORD) return `This message is too large to send (${formatBytes(new TextEncoder().encode(text).length)}).`
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
	const pinned = state.pinned
	text.style.height = 'auto'
	text.style.height = `${Math.min(text.scrollHeight + 2, 160)}px`
	text.style.overflowY = text.scrollHeight + 2 > 160 ? 'auto' : 'hidden'
	if (pinned) $('#messages').scrollTop = $('#messages').scrollHeight
}

/** Tell the room we are typing (at most every few seconds). */
function typing() {
	const view = state.rooms.get(state.active)
	if (!view || view.state !== 'joined' || !view.channel || !$('#text').value.trim()) return
	const now = performance.now()
	if (now - view.typedAt < TYPING_EVERY) return
	view.typedAt = now
	view.channel.write(encodeRecord({ type: 'typing' })).catch(() => {})
}

/** Say `text` in the room shown: it shows at once, as sending, until the server relays it.
 * Written with an id: if the connection goes first, it is sent again once back, and the
 * server relays it once. */
async function say(text) {
	const view = state.rooms.get(state.active)
	if (!view || view.state !== 'joined' || !text.trim()) return false
	const problem = tooLong(text)
	if (problem) {
		checkDraft()
		return false
	}
	const id = randomId()
	const channel = view.channel
	view.pending.set(id, { text, item: ownBubble(view, text, id), at: performance.now() })
	view.typedAt = 0
	try {
		await channel.write(encodeRecord({ type: 'say', text, id }))
	} catch (error) {
		if (!channel.session.error) {
			// Not the connection: the room is closing. Say so; the text goes back to the box.
			view.pending.get(id)?.item.remove()
			view.pending.delete(id)
			notice(view, `Not sent (${plain(error)}): ${text.length > 80 ? `${text.slice(0, 80)}…` : text}`, 'bad')
			return false
		}
		// The connection went: sent again once the room is joined again.
	}
	return true
}

// -- the nick ---------------------------------------------------------------------------------

/** The nick of the form or of the chip; it applies to every room joined (renamed there). */
function setNick(nick) {
	if (nick === state.nick) return
	state.nick = nick
	localStorage.setItem('polymux-webchat-nick', nick)
	$('#me-name').textContent = nick
	$('#me-initial').textContent = [...nick][0] ?? ''
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
		setTimeout(() => {
			const line = $('#notice [data-topic="nick"]')
			if (line?.classList.contains('info')) line.textContent = ''
		}, 4000)
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
	$('#me-name').textContent = state.nick
	$('#me-initial').textContent = [...state.nick][0] ?? ''
	drawComposer()
	drawMembers()
}

// -- keeping this tab's rooms across a reload ---------------------------------------------------

function save() {
	const views = [...state.rooms.values()].filter(v => v.state !== 'closed')
	const rooms = views.map(v => v.room)
	const read = Object.fromEntries(views.filter(v => v.epoch).map(v => [v.room, { epoch: v.epoch, seq: v.read }]))
	sessionStorage.setItem('polymux-webchat', JSON.stringify({ nick: state.nick, rooms, active: state.active, read, token: state.token }))
}

function restore() {
	const params = new URLSearchParams(location.search)
	if (params.get('nick')) return { nick: params.get('nick').trim(), rooms: (params.get('room') || 'lobby').split(',').map(r => r.trim().replace(/^#/, '')).filter(Boolean), active: null, link: true }
	try {
		const saved = JSON.parse(sessionStorage.getItem('polymux-webchat') || 'null')
		if (saved && typeof saved.nick === 'string') return saved
	} catch {
		// nothing usable saved
	}
	return { nick: localStorage.getItem('polymux-webchat-nick') || '', rooms: [], active: null }
}

// -- people and files on a narrow screen: a panel over the chat ----------------------------------

function openSide(panel) {
	document.body.dataset.panel = panel
	document.body.classList.add('side-open')
	$('#tab-people').setAttribute('aria-selected', String(panel === 'people'))
	$('#tab-files').setAttribute('aria-selected', String(panel === 'files'))
	if (panel === 'files') {
		state.newFiles = 0
		$('#files-count').textContent = ''
	}
	$('#close-side').focus()
}

function closeSide() {
	if (!document.body.classList.contains('side-open')) return
	document.body.classList.remove('side-open')
}

function narrow() {
	return matchMedia('(max-width: 760px)').matches
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
		this.row = element('li', { className: 'transfer', 'data-kind': kind, 'data-name': name, 'data-state': 'starting' }, element('div', { className: 'head' }, this.title, this.pause, this.stop), this.bar, this.info)
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
			if (speed !== null) text = `${of} · ${speed.toFixed(speed < 100 ? 1 : 0)} MB/s`
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
		const speed = this.moved >= 1e6 ? ` · ${mbps.toFixed(mbps < 100 ? 1 : 0)} MB/s` : ''
		// Checked end to end; the hash itself only for those who ask.
		const check = element('details', {}, element('summary', {}, 'verified ✓'), element('code', {}, `SHA-256 ${sha256}`))
		this.info.replaceChildren(`${formatBytes(this.size)}${speed}${note} · `, check)
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
	if (!record) throw new Error(`the server ended the transfer ${what}`)
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
		t.row.querySelector('.head').append(save)
		save.click()
	})
}

// -- the list of files on the server ------------------------------------------------------------

function showFiles(answer) {
	const before = state.listed ? new Set(state.files.map(f => f.name)) : null
	state.files = answer.files
	state.listed = true
	let fresh = 0
	const rows = answer.files.map(file => {
		const get = element('button', { type: 'button', className: 'get', 'data-name': file.name, title: `Download ${file.name}`, disabled: !state.session }, element('span', { className: 'name' }, file.name), element('span', { className: 'size' }, formatBytes(file.size)))
		get.addEventListener('click', () => download(file.name))
		const isNew = before !== null && !before.has(file.name) // new since the list was last shown
		if (isNew) fresh++
		return element('li', { 'data-name': file.name, 'data-size': file.size, className: isNew ? 'fresh' : '' }, get)
	})
	if (!rows.length) rows.push(element('li', { className: 'empty' }, 'No files yet: share one with the paper clip.'))
	if (answer.truncated) rows.push(element('li', { className: 'empty' }, `Showing the first ${answer.files.length} files.`))
	$('#listing').replaceChildren(...rows)
	if (fresh && narrow() && !(document.body.classList.contains('side-open') && document.body.dataset.panel === 'files')) {
		state.newFiles = (state.newFiles || 0) + fresh
		$('#files-count').textContent = String(state.newFiles)
	}
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

function openDialog(dialog, input, value) {
	dialog.querySelector('.problem').textContent = ''
	input.value = value
	dialog.showModal()
	input.focus()
	input.select()
}
for (const dialog of document.querySelectorAll('dialog')) {
	dialog.querySelector('.cancel').addEventListener('click', () => dialog.close())
	dialog.addEventListener('click', event => event.target === dialog && dialog.close()) // the backdrop
}
$('#add-room').addEventListener('click', () => openDialog($('#room-dialog'), $('#new-room'), ''))
$('#join-room').addEventListener('submit', event => {
	event.preventDefault()
	const room = $('#new-room').value.trim().replace(/^#/, '')
	const problem = labelProblem('room name', room)
	if (problem) {
		$('#room-dialog .problem').textContent = problem
		return $('#new-room').focus()
	}
	$('#room-dialog').close()
	alertLine('')
	join(room)
})
$('#me').addEventListener('click', () => openDialog($('#nick-dialog'), $('#new-nick'), state.nick))
$('#rename').addEventListener('submit', event => {
	event.preventDefault()
	const nick = $('#new-nick').value.trim()
	const problem = labelProblem('nick', nick)
	if (problem) {
		$('#nick-dialog .problem').textContent = `${problem} Your nick stays ${state.nick}.`
		return $('#new-nick').focus()
	}
	$('#nick-dialog').close()
	$('#nick').value = nick
	setNick(nick)
})

$('#say').addEventListener('submit', async event => {
	event.preventDefault()
	const text = $('#text').value
	if (!text.trim()) return
	if (tooLong(text)) return checkDraft()
	$('#text').value = ''
	checkDraft()
	if (state.touch) $('#text').focus() // the keyboard stays up for the next message
	if (!(await say(text)) && !$('#text').value) {
		$('#text').value = text // not sent: keep it for another try
		checkDraft()
	}
})
$('#text').addEventListener('input', () => {
	checkDraft()
	typing()
})
$('#text').addEventListener('keydown', event => {
	// Enter sends on a keyboard (Shift+Enter: a new line); on a touch screen Enter is a new
	// line and the Send button sends, as in phone chat apps (their keyboards have no Shift+Enter).
	if (event.key === 'Enter' && !event.shiftKey && !event.isComposing && !state.touch) {
		event.preventDefault()
		$('#say').requestSubmit()
	}
})
coarse.addEventListener('change', () => {
	state.touch = coarse.matches
	drawComposer()
})
$('#retry').addEventListener('click', () => {
	state.attempt = 0
	connectNow()
})
window.addEventListener('online', () => connectNow())
document.addEventListener('visibilitychange', () => {
	const view = state.rooms.get(state.active)
	if (document.hidden) {
		if (view) view.away = false // what comes while hidden gets its "New since you left" line
		save()
		return
	}
	if (view) {
		view.unread = 0
		view.read = view.last
		drawTab(view)
	}
	if (!state.session && state.timer) connectNow()
})
window.addEventListener('pagehide', save)
$('#messages').addEventListener('scroll', onScroll, { passive: true })
$('#new-pill').addEventListener('click', toBottom)
// The list keeps showing the newest message when it shrinks (a phone's keyboard comes up).
new ResizeObserver(() => {
	if (state.pinned) $('#messages').scrollTop = $('#messages').scrollHeight
}).observe($('#messages'))
// A tap on a message shows its time (a mouse shows it on hover).
$('#messages').addEventListener('click', event => {
	if (event.target.closest('a, button')) return
	const item = event.target.closest('li.msg, li.file')
	if (!item) return
	for (const other of document.querySelectorAll('#messages li.show-time')) if (other !== item) other.classList.remove('show-time')
	item.classList.toggle('show-time')
})

/** The page's height is what the keyboard leaves (the visual viewport): the message box
 * stays on its top edge. */
function fitViewport() {
	const vv = window.visualViewport
	if (!vv || Math.abs(vv.scale - 1) > 0.01) return // zoomed in: leave the layout alone
	document.documentElement.style.setProperty('--app-height', `${Math.round(vv.height)}px`)
	if (vv.offsetTop) window.scrollTo(0, 0)
}
window.visualViewport?.addEventListener('resize', fitViewport)
window.addEventListener('resize', fitViewport)
fitViewport()

$('#open-people').addEventListener('click', () => openSide('people'))
$('#open-files').addEventListener('click', () => openSide('files'))
$('#tab-people').addEventListener('click', () => openSide('people'))
$('#tab-files').addEventListener('click', () => openSide('files'))
$('#close-side').addEventListener('click', closeSide)
document.addEventListener('keydown', event => {
	if (event.key === 'Escape' && document.body.classList.contains('side-open')) closeSide()
})

function pickFiles() {
	closeSide()
	$('#pick').click()
}
$('#attach').addEventListener('click', pickFiles)
$('#upload').addEventListener('click', pickFiles)
$('#pick').addEventListener('change', event => {
	for (const file of event.target.files) upload(file)
	event.target.value = ''
})
// Files dropped anywhere on the page are uploaded (the browser would otherwise open them).
const drop = $('#drop')
window.addEventListener('dragover', event => {
	event.preventDefault()
	const view = state.rooms.get(state.active)
	drop.firstElementChild.textContent = view && view.state === 'joined' ? `Drop files to share them in #${view.room}` : 'Drop files to put them on the server'
	drop.hidden = false
})
window.addEventListener('dragleave', event => {
	if (!event.relatedTarget) drop.hidden = true
})
window.addEventListener('drop', event => {
	event.preventDefault()
	drop.hidden = true
	if (!state.session) return alertLine('Not connected: drop the files again once the connection is back.')
	for (const file of event.dataTransfer.files) upload(file)
})
$('#refresh').addEventListener('click', refreshFiles)
$('#clear').addEventListener('click', clearFinished)

Object.assign(state, { join, say, leave, upload, download, refreshFiles, connectNow, formatBytes, linkify })

function start() {
	const saved = restore()
	const reloaded = performance.getEntriesByType('navigation')[0]?.type === 'reload'
	// A reload takes its token back: its new channels replace those the server still holds.
	// A new tab (or a copied one) gets its own.
	state.token = reloaded && typeof saved.token === 'string' ? saved.token : randomId(16)
	state.nick = saved.nick || ''
	$('#nick').value = state.nick
	setOnline(false)
	for (const room of saved.rooms || []) {
		if (labelProblem('room name', room) || state.rooms.has(room)) continue
		const view = makeView(room)
		view.state = 'waiting'
		view.restored = reloaded || !saved.link // back after a reload (not a first visit by a link)
		const read = saved.read?.[room]
		if (read && Number.isInteger(read.seq)) Object.assign(view, { restoredRead: read.seq, restoredEpoch: read.epoch, read: read.seq })
		state.rooms.set(room, view)
		$('#rooms').append(view.tab)
		$('#messages').append(view.list)
	}
	select(state.rooms.size ? (saved.active && state.rooms.has(saved.active) ? saved.active : state.rooms.keys().next().value) : null)
	if (state.rooms.size && labelProblem('nick', state.nick)) {
		alertLine(labelProblem('nick', state.nick))
		for (const view of [...state.rooms.values()]) forget(view)
	}
	if (!state.rooms.size) (state.nick ? $('#room') : $('#nick')).focus()
	else if (!state.touch) $('#text').focus()
	checkLiveness()
	connectNow()
}

start()
