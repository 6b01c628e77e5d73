// Interop test peer for polymux: drives the Go library github.com/xtaci/smux (the smux of
// kcptun and of the tools built on kcp-go) over a real TCP or unix socket.
//
//	smux_peer --listen|--connect --tcp PORT|--unix PATH --mode responder|driver|bench
//	    [--version 1|2] [--channels N=64] [--size BYTES=1048576] [--big BYTES=0]
//	    [--timeout-ms MS=90000] [--keepalive-ms MS] [--min-nops K] [--hold] [--no-tap]
//
// Built against the Debian package golang-github-xtaci-smux-dev (1.5.16) with
// `GOPATH=/usr/share/gocode GO111MODULE=off go build` (tests/interop/gobuild.py). Library
// defaults are kept (version 1, NOP every 10 s and close after 30 s without a frame, 32 KiB
// frames, 4 MiB session receive buffer, 64 KiB stream window in version 2) unless a flag
// below changes them. Both ends must use the same --version: smux does not negotiate it.
//
// --listen listens on 127.0.0.1 (--tcp 0 = any free port) or on the unix path, prints
// `LISTENING <port|path>`, accepts ONE connection, runs the mode, exits. --connect connects.
// The connecting side is the smux client (odd stream ids from 3), the listener the server
// (even ids from 2).
//
// stdout: `LISTENING ...` (listen only), then one JSON summary line ({"ok":...}). Everything
// else goes to stderr. The summary has "wire": frames seen on the socket in each direction,
// decoded by a tap independent of the library. exit: 0 success, 1 a check failed, 2 bad
// usage, 3 watchdog.
//
// Stream names: smux has none. The OPENING side writes a first line `<name>\n`. The end of a
// message is never a half-close by this peer (see below): every exchange carries its length.
// The responder reacts by the name:
//
//	echo/<n>       read n bytes and echo them as they come, wait for the FIN, Close().
//	big/<n>        read n bytes, reply "<n> <sha256 hex>", wait for the FIN, Close().
//	bulk/<n>       read n bytes, reply the byte 0x01, wait for the FIN, Close() (benchmark).
//	halfclose/<k>  count bytes until the FIN (the opener's half-close), then reply
//	               "<count>\n" followed by k pattern bytes (index 5), Close().
//	abort/<n>      read n bytes, reply "ready\n", then expect the end (polymux's abort is a
//	               FIN: smux has no reset) with no more bytes.
//	close/<n>      read n bytes, reply "closing\n" and Close() at once (FIN).
//	nops/<k>       wait until k NOPs arrived (counted by the tap), reply "nops <k>\n", then as
//	               echo/0.
//	(other)        Close() at once (counted as "unknown").
//
// Driver (this peer opens the streams, all at the same time): --channels streams
// `echo/<size>` (byte j = (j*31 + i*7) & 0xff), written in 64 KiB writes while the echo is
// read back and compared, then Close(). --hold opens every stream before any is written to.
// --big n > 0: one `big/<n>` stream (pattern 99) -> "<n> <sha256>". `close/x` must read as
// the end at once (the peer's FIN). --min-nops K: wait for K NOPs from the peer. Then wait
// until the peer sent its FIN on every stream this side opened, and close the session.
//
// Bench (Go to Go throughput, for benchmarks/): opens --channels `bulk/<size>` streams, then
// times from the first write to the last 0x01 reply. Summary {"ok", "ms", "mib_per_s"}.
//
// What xtaci/smux 1.5.16 does that a peer must know (read from its source under
// /usr/share/gocode/src/github.com/xtaci/smux):
//   - There is no half-close: Stream.Close() sends FIN and forgets the stream at once (its
//     unread data is dropped; later frames for it are ignored). So this peer never closes a
//     stream before it has read the answer, whose length it knows.
//   - After the peer's FIN, Read returns what is buffered, then EOF. In version 2, a Write
//     that must wait for window after the peer's FIN fails with EOF (until v1.5.54): a
//     reply after the opener's half-close must fit in the window it announced.
//   - Nothing acknowledges SYN; a second SYN for an open id is ignored; PSH, FIN and UPD for
//     unknown streams are ignored. The accept queue holds 1,024 streams; beyond them the
//     whole session stops reading until Accept() is called.
//   - A NOP goes out every KeepAliveInterval; the session closes when nothing arrived for
//     KeepAliveTimeout (and its receive buffer is not full).
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"../peer"

	"github.com/xtaci/smux"
)

var (
	version     = 1
	keepaliveMs = -1
	minNops     = 0
	hold        = false
	noTap       = false
)

func main() {
	p := peer.Start(peer.Spec{
		Name:     "smux_peer",
		Modes:    []string{"responder", "driver", "bench"},
		Defaults: peer.Options{Channels: 64, Size: 1 << 20, Big: 0, TimeoutMs: 90000},
		Extra: func(fs *flag.FlagSet) {
			fs.IntVar(&version, "version", 1, "smux protocol version (1 or 2)")
			fs.IntVar(&keepaliveMs, "keepalive-ms", -1, "NOP interval, timeout 3 x it (0: off; default the library's 10 s / 30 s)")
			fs.IntVar(&minNops, "min-nops", 0, "driver: wait for this many NOPs from the peer")
			fs.BoolVar(&hold, "hold", false, "driver: open every stream before writing to any")
			fs.BoolVar(&noTap, "no-tap", false, "no wire tap")
		},
	})
	p.Run(func(conn net.Conn) bool {
		cfg := smux.DefaultConfig()
		cfg.Version = version
		if keepaliveMs == 0 {
			cfg.KeepAliveDisabled = true
		} else if keepaliveMs > 0 {
			cfg.KeepAliveInterval = time.Duration(keepaliveMs) * time.Millisecond
			cfg.KeepAliveTimeout = 3 * cfg.KeepAliveInterval
		}
		rx, tx := newTap(), newTap()
		if !noTap && p.Opts.Mode != "bench" {
			conn = &peer.TappedConn{Conn: conn, RX: rx, TX: tx}
		}
		var sess *smux.Session
		var err error
		if p.IsClient() {
			sess, err = smux.Client(conn, cfg)
		} else {
			sess, err = smux.Server(conn, cfg)
		}
		if err != nil {
			p.Logf("fatal: %v", err)
			return false
		}
		r := &run{p: p, sess: sess, rx: rx, tx: tx}
		switch p.Opts.Mode {
		case "responder":
			return r.responder()
		case "driver":
			return r.driver()
		default:
			return r.bench()
		}
	})
}

type run struct {
	p        *peer.Peer
	sess     *smux.Session
	rx, tx   *tap
	fails    peer.Failures
	handled  peer.Counter
	mu       sync.Mutex
	names    []string
	openedBy []uint32 // stream ids this side opened
}

func (r *run) common(summary map[string]interface{}) map[string]interface{} {
	summary["role"] = map[bool]string{true: "client", false: "server"}[r.p.IsClient()]
	summary["transport"] = r.p.Opts.Transport()
	summary["version"] = version
	summary["wire"] = map[string]interface{}{"rx": r.rx.snapshot(), "tx": r.tx.snapshot()}
	summary["elapsed_ms"] = r.p.ElapsedMs()
	failures := r.fails.List()
	summary["failures"] = failures
	summary["ok"] = len(failures) == 0
	return summary
}

// ------------------------------------------------------------------ responder

func (r *run) responder() bool {
	var wg sync.WaitGroup
	var acceptErr error
	var running sync.Map // stream id -> name, while its behaviour runs
	for {
		st, err := r.sess.AcceptStream()
		if err != nil {
			acceptErr = err
			break
		}
		wg.Add(1)
		go func(st *smux.Stream) {
			defer wg.Done()
			running.Store(st.ID(), "")
			r.respond(st)
			running.Delete(st.ID())
		}(st)
	}
	r.p.Logf("accept ended: %v", acceptErr)
	// The connection is gone: closing the session ends every behaviour still waiting.
	r.sess.Close()
	wg.Wait()
	unfinished := []string{}
	running.Range(func(k, v interface{}) bool {
		unfinished = append(unfinished, fmt.Sprintf("%v %v", k, v))
		return true
	})
	sort.Strings(unfinished)
	r.mu.Lock()
	names := append([]string{}, r.names...)
	r.mu.Unlock()
	if len(names) > 40 {
		names = names[:40]
	}
	s := r.common(map[string]interface{}{
		"mode":         "responder",
		"handled":      r.handled.Map(),
		"names":        names,
		"unfinished":   unfinished,
		"accept_error": fmt.Sprint(acceptErr),
	})
	peer.Summary(s)
	return s["ok"].(bool)
}

func (r *run) respond(st *smux.Stream) {
	br := bufio.NewReader(st)
	name, err := peer.ReadLine(br)
	if err != nil {
		r.fails.Add(r.p, "stream %d: no name line: %v", st.ID(), err)
		st.Close()
		return
	}
	r.mu.Lock()
	r.names = append(r.names, name)
	r.mu.Unlock()
	kind, arg := name, ""
	if i := strings.IndexByte(name, '/'); i >= 0 {
		kind, arg = name[:i], name[i+1:]
	}
	n, numErr := strconv.Atoi(arg)
	fail := func(format string, args ...interface{}) {
		r.fails.Add(r.p, "%s (stream %d): %s", name, st.ID(), fmt.Sprintf(format, args...))
	}
	if numErr != nil && kind != "halfclose" {
		kind = "unknown"
	}
	switch kind {
	case "echo":
		if _, err := io.CopyN(st, br, int64(n)); err != nil {
			fail("echo: %v", err)
		}
		waitEOF(br, fail)
	case "big":
		h := sha256.New()
		if total, err := io.CopyN(h, br, int64(n)); err != nil {
			fail("read after %d bytes: %v", total, err)
		}
		writeOrFail(st, []byte(fmt.Sprintf("%d %s", n, hex.EncodeToString(h.Sum(nil)))), fail)
		waitEOF(br, fail)
	case "bulk":
		if _, err := io.CopyN(io.Discard, br, int64(n)); err != nil {
			fail("read: %v", err)
		}
		writeOrFail(st, []byte{1}, fail)
		waitEOF(br, fail)
	case "halfclose":
		total, err := drain(br)
		if err != nil {
			fail("read: %v", err)
		}
		writeOrFail(st, append([]byte(fmt.Sprintf("%d\n", total)), peer.Pattern(5, n)...), fail)
	case "abort":
		if _, err := io.CopyN(io.Discard, br, int64(n)); err != nil {
			fail("read: %v", err)
			break
		}
		writeOrFail(st, []byte("ready\n"), fail)
		waitEOF(br, fail)
		r.handled.Inc("abort_seen")
	case "close":
		if _, err := io.CopyN(io.Discard, br, int64(n)); err != nil {
			fail("read: %v", err)
		}
		writeOrFail(st, []byte("closing\n"), fail)
	case "nops":
		got := r.rx.waitNops(n)
		writeOrFail(st, []byte(fmt.Sprintf("nops %d\n", got)), fail)
		waitEOF(br, fail)
	default:
		kind = "unknown"
	}
	r.handled.Inc(kind)
	st.Close()
}

func writeOrFail(st *smux.Stream, b []byte, fail func(string, ...interface{})) {
	if _, err := st.Write(b); err != nil {
		fail("write: %v", err)
	}
}

// drain reads to the end; io.EOF is the normal end (smux's Stream.WriteTo, which io.Copy
// uses, returns it).
func drain(rd io.Reader) (int64, error) {
	k, err := io.Copy(io.Discard, rd)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return k, err
}

func waitEOF(br *bufio.Reader, fail func(string, ...interface{})) {
	if k, err := drain(br); err != nil || k != 0 {
		fail("expected the FIN, got %d more bytes (%v)", k, err)
	}
}

// ------------------------------------------------------------------ driver

type outcome struct {
	OK  bool   `json:"ok"`
	ID  uint32 `json:"id"`
	Err string `json:"err,omitempty"`
}

func (r *run) open() (*smux.Stream, error) {
	st, err := r.sess.OpenStream()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.openedBy = append(r.openedBy, st.ID())
	r.mu.Unlock()
	return st, nil
}

// echo writes the name line and data on st while reading the echo back; then Close().
func echo(st *smux.Stream, data []byte) outcome {
	out := outcome{ID: st.ID()}
	errc := make(chan error, 1)
	go func() {
		if _, err := st.Write([]byte(fmt.Sprintf("echo/%d\n", len(data)))); err != nil {
			errc <- err
			return
		}
		errc <- peer.WriteAll(st, data)
	}()
	got := make([]byte, len(data))
	k, rerr := io.ReadFull(st, got)
	werr := <-errc
	st.Close()
	switch {
	case rerr != nil:
		out.Err = fmt.Sprintf("read after %d of %d bytes: %v", k, len(data), rerr)
	case werr != nil:
		out.Err = werr.Error()
	case !bytes.Equal(got, data):
		i := 0
		for i < len(got) && got[i] == data[i] {
			i++
		}
		out.Err = fmt.Sprintf("echo differs from byte %d", i)
	default:
		out.OK = true
	}
	return out
}

func (r *run) driver() bool {
	o := r.p.Opts
	summary := map[string]interface{}{"mode": "driver", "channels": o.Channels, "size": o.Size, "big": o.Big}
	var wg sync.WaitGroup

	results := make([]outcome, o.Channels)
	start := time.Now()
	streams := make([]*smux.Stream, o.Channels)
	if hold {
		for i := range streams {
			st, err := r.open()
			if err != nil {
				r.fails.Add(r.p, "echo/%d: OpenStream: %v", i, err)
				break
			}
			streams[i] = st
		}
	}
	for i := 0; i < o.Channels; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			st := streams[i]
			if st == nil && !hold {
				var err error
				if st, err = r.open(); err != nil {
					results[i] = outcome{Err: "OpenStream: " + err.Error()}
					return
				}
			}
			if st == nil {
				results[i] = outcome{Err: "not opened"}
				return
			}
			results[i] = echo(st, peer.Pattern(i, o.Size))
		}(i)
	}
	var bigResult, closeResult map[string]interface{}
	if o.Big > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bigResult = r.bigStream(o.Big)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		closeResult = r.closeStream()
	}()
	wg.Wait()
	echoMs := time.Since(start)

	okCount := 0
	ids := []uint32{}
	for i, res := range results {
		if res.OK {
			okCount++
			if len(ids) < 4 {
				ids = append(ids, res.ID)
			}
		} else {
			r.fails.Add(r.p, "echo/%d (stream %d): %s", i, res.ID, res.Err)
		}
	}
	summary["echo_ok"] = okCount
	summary["echo_ms"] = echoMs.Milliseconds()
	summary["echo_mib_per_s"] = peer.MiBPerS(2*int64(okCount)*int64(o.Size), echoMs)
	summary["stream_ids"] = ids
	summary["big"] = bigResult
	summary["close_stream"] = closeResult
	if minNops > 0 {
		got := r.rx.waitNops(minNops)
		if got < minNops {
			r.fails.Add(r.p, "keepalive: %d NOPs received, want %d", got, minNops)
		}
		summary["nops_seen"] = got
	}
	// Every stream we opened must have been ended by the peer (its FIN).
	r.mu.Lock()
	opened := append([]uint32{}, r.openedBy...)
	r.mu.Unlock()
	if missing := r.rx.waitEnded(opened); len(missing) > 0 {
		r.fails.Add(r.p, "the connection ended before the peer ended %d of our streams (first: %d)", len(missing), missing[0])
	}
	summary["session_closed_early"] = r.sess.IsClosed()
	if r.sess.IsClosed() {
		r.fails.Add(r.p, "the session was closed (keepalive timeout?) before the driver finished")
	}
	r.sess.Close()
	peer.Summary(r.common(summary))
	return len(r.fails.List()) == 0
}

func (r *run) bigStream(n int) map[string]interface{} {
	data := peer.Pattern(99, n)
	sum := sha256.Sum256(data)
	want := fmt.Sprintf("%d %s", n, hex.EncodeToString(sum[:]))
	t := time.Now()
	st, err := r.open()
	if err != nil {
		r.fails.Add(r.p, "big: OpenStream: %v", err)
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		if _, err := st.Write([]byte(fmt.Sprintf("big/%d\n", n))); err != nil {
			errc <- err
			return
		}
		errc <- peer.WriteAll(st, data)
	}()
	reply := make([]byte, len(want))
	_, rerr := io.ReadFull(st, reply)
	werr := <-errc
	ms := time.Since(t)
	st.Close()
	if rerr != nil || werr != nil || string(reply) != want {
		r.fails.Add(r.p, "big: reply %q (want %q), read %v, write %v", reply, want, rerr, werr)
	}
	return map[string]interface{}{"reply": string(reply), "ms": ms.Milliseconds(), "mib_per_s": peer.MiBPerS(int64(n), ms)}
}

// closeStream: the peer ends `close/x` at once; we read the end (EOF), then Close().
func (r *run) closeStream() map[string]interface{} {
	st, err := r.open()
	if err != nil {
		r.fails.Add(r.p, "close: OpenStream: %v", err)
		return nil
	}
	if _, err := st.Write([]byte("close/x\n")); err != nil {
		r.fails.Add(r.p, "close: write: %v", err)
	}
	k, err := drain(st)
	st.Close()
	if err != nil || k != 0 {
		r.fails.Add(r.p, "close/x: expected the peer's FIN at once, got %d bytes then %v", k, err)
	}
	return map[string]interface{}{"bytes": k, "err": fmt.Sprint(err)}
}

// ------------------------------------------------------------------ bench

func (r *run) bench() bool {
	o := r.p.Opts
	elapsed, streams := peer.Bulk(r.p, &r.fails, func() (io.ReadWriteCloser, error) { return r.sess.OpenStream() })
	for _, st := range streams {
		st.Close()
	}
	r.sess.Close()
	total := int64(o.Size) * int64(len(streams))
	failures := r.fails.List()
	peer.Summary(map[string]interface{}{
		"ok":         len(failures) == 0,
		"mode":       "bench",
		"version":    version,
		"channels":   o.Channels,
		"size":       o.Size,
		"ms":         float64(elapsed.Microseconds()) / 1000,
		"mib_per_s":  peer.MiBPerS(total, elapsed),
		"failures":   failures,
		"elapsed_ms": r.p.ElapsedMs(),
	})
	return len(failures) == 0
}

// ------------------------------------------------------------------ wire tap

// tap decodes smux frame headers from the raw bytes of one direction, independently of the
// library, for the summary; the receiving tap also lets the driver wait for the peer's FIN
// on its streams and for NOPs.
type tap struct {
	mu     sync.Mutex
	cond   *sync.Cond
	hdr    [8]byte
	have   int
	skip   uint32
	s      tapStats
	ended  map[uint32]bool
	closed bool // the connection ended: waits give up
	inUPD  bool // the bytes being skipped are a UPD body
	updBuf []byte
}

type tapStats struct {
	Frames       int64          `json:"frames"`
	Bytes        int64          `json:"bytes"`
	Kinds        map[string]int `json:"kinds"`
	DataBytes    int64          `json:"data_bytes"`
	DataFrameMax uint16         `json:"data_frame_max"`
	NopIDs       map[string]int `json:"nop_ids"`
	UPDWindows   map[string]int `json:"upd_windows"`
	Versions     map[string]int `json:"versions"`
	Bad          int            `json:"bad"`
}

func newTap() *tap {
	t := &tap{ended: map[uint32]bool{}}
	t.s.Kinds = map[string]int{}
	t.s.NopIDs = map[string]int{}
	t.s.UPDWindows = map[string]int{}
	t.s.Versions = map[string]int{}
	t.cond = sync.NewCond(&t.mu)
	return t
}

var cmdNames = []string{"SYN", "FIN", "PSH", "NOP", "UPD"}

func (t *tap) Feed(b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.s.Bytes += int64(len(b))
	for len(b) > 0 {
		if t.skip > 0 {
			k := uint32(len(b))
			if k > t.skip {
				k = t.skip
			}
			if t.inUPD {
				t.updBuf = append(t.updBuf, b[:k]...)
				if len(t.updBuf) == 8 {
					t.upd(t.updBuf)
				}
			}
			t.skip -= k
			b = b[k:]
			continue
		}
		k := copy(t.hdr[t.have:], b)
		t.have += k
		b = b[k:]
		if t.have < 8 {
			break
		}
		t.have = 0
		t.frame()
	}
	t.cond.Broadcast()
}

func (t *tap) frame() {
	h := t.hdr[:]
	ver, cmd := h[0], h[1]
	length := binary.LittleEndian.Uint16(h[2:])
	id := binary.LittleEndian.Uint32(h[4:])
	s := &t.s
	s.Frames++
	s.Versions[strconv.Itoa(int(ver))]++
	name := fmt.Sprintf("cmd%d", cmd)
	if int(cmd) < len(cmdNames) {
		name = cmdNames[cmd]
	}
	if int(ver) != version || cmd > 4 {
		s.Bad++
	}
	s.Kinds[name]++
	t.inUPD = false
	switch cmd {
	case 1:
		t.ended[id] = true
	case 2:
		s.DataBytes += int64(length)
		if length > s.DataFrameMax {
			s.DataFrameMax = length
		}
	case 3:
		s.NopIDs[strconv.Itoa(int(id))]++
	case 4:
		t.inUPD = length == 8
		t.updBuf = t.updBuf[:0]
	}
	t.skip = uint32(length)
}

func (t *tap) upd(body []byte) {
	window := binary.LittleEndian.Uint32(body[4:])
	t.s.UPDWindows[strconv.Itoa(int(window))]++
	t.inUPD = false
}

func (t *tap) Close() {
	t.mu.Lock()
	t.closed = true
	t.cond.Broadcast()
	t.mu.Unlock()
}

// waitEnded waits (bounded by the watchdog) until a FIN arrived for every id, or the
// connection ended; returns the ids that got none.
func (t *tap) waitEnded(ids []uint32) []uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	missing := []uint32{}
	for _, id := range ids {
		for !t.ended[id] && !t.closed {
			t.cond.Wait()
		}
		if !t.ended[id] {
			missing = append(missing, id)
		}
	}
	return missing
}

// waitNops waits until k NOPs were received (or the connection ended); returns the count.
func (t *tap) waitNops(k int) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	for t.s.Kinds["NOP"] < k && !t.closed {
		t.cond.Wait()
	}
	return t.s.Kinds["NOP"]
}

func (t *tap) snapshot() tapStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.s
	s.Kinds = copyMap(t.s.Kinds)
	s.NopIDs = copyMap(t.s.NopIDs)
	s.UPDWindows = copyMap(t.s.UPDWindows)
	s.Versions = copyMap(t.s.Versions)
	return s
}

func copyMap(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = v
	}
	return out
}
