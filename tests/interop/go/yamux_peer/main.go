// Interop test peer for polymux: drives the Go library github.com/hashicorp/yamux (the yamux
// that Consul, Nomad, Vault and every go-plugin host speak) over a real TCP or unix socket.
//
//	yamux_peer --listen|--connect --tcp PORT|--unix PATH --mode responder|driver|bench
//	    [--channels N=64] [--size BYTES=1048576] [--big BYTES=0] [--timeout-ms MS=90000]
//	    [--keepalive-ms MS] [--backlog N=256] [--min-pings K] [--goaway] [--gate] [--hold]
//	    [--allow-resets] [--no-tap]
//
// Built against the Debian package golang-github-hashicorp-yamux-dev (snapshot df201c7) with
// `GOPATH=/usr/share/gocode GO111MODULE=off go build` (tests/interop/gobuild.py). Library
// defaults are kept (AcceptBacklog 256, keepalive every 30 s, 256 KiB stream windows, no
// window growth) unless a flag below changes them.
//
// --listen listens on 127.0.0.1 (--tcp 0 = any free port) or on the unix path, prints
// `LISTENING <port|path>`, accepts ONE connection, runs the mode, exits. --connect connects.
// The connecting side is the yamux client (odd stream ids), the listening side the server.
//
// stdout: `LISTENING ...` (listen only), then one JSON summary line ({"ok":...}). Everything
// else goes to stderr, including the library's own log (it logs synchronously from its
// receive loop: the caller must drain stderr). The summary has "yamux_log" (counts of the
// library's warnings, e.g. "frame for missing stream", "backlog exceeded") and "wire"
// (frames seen on the socket in each direction, decoded by a tap independent of the library).
// exit: 0 success, 1 a check failed, 2 bad usage, 3 watchdog.
//
// Stream names: yamux has none. The OPENING side writes a first line `<name>\n`; the
// responder reacts by the name:
//
//	echo/*        echo every byte until the peer's FIN, then Close() (FIN).
//	halfclose/*   count bytes until the FIN, reply the decimal count, Close().
//	big/<n>       read n bytes, reply "<n> <sha256 hex>", wait for the FIN, Close();
//	big/x         the same, reading until the FIN.
//	bulk/<n>      read n bytes, reply the byte 0x01, wait for the FIN, Close() (benchmark).
//	reset/<n>     read n bytes, reply "ready\n", then expect the peer's RST (a FIN fails).
//	goaway/*      session.GoAway(), reply "goaway-sent\n", wait for the FIN, Close().
//	pings/<k>     wait until k keepalive pings went each way (counted by the tap: Ping|SYN
//	              received and Ping|ACK received), reply "pings <syn> <ack>\n", then as goaway.
//	(other)       Close() at once (counted as "unknown").
//
// --gate (responder): the FIRST stream accepted is a gate: after its name line the responder
// replies "gated\n" and calls Accept() no more until the gate receives a line ("open\n").
// SYNs that arrive meanwhile wait in the library's accept backlog (--backlog), and the ones
// beyond it are reset by the library ("backlog exceeded"). That makes the backlog
// deterministic to test.
//
// Driver (this peer opens the streams; all at the same time):
//
//	--channels streams `echo/<i>` of --size bytes each, byte j = (j*31 + i*7) & 0xff, written
//	in 64 KiB writes while the echo is read back and compared; then Close(). --hold opens
//	every stream before any is written to (so all are open at once). --big n > 0: one
//	`big/<n>` stream (pattern 99) -> "<n> <sha256>". `error/x` must end with the peer's RST.
//	session.Ping() RTT. --min-pings K: wait for K keepalive pings each way. --goaway: open
//	`goawaycheck/x`, call session.GoAway(), send "sent\n" and expect a reply starting with
//	"refused" (the peer cannot open streams any more). Then wait until the peer ended (FIN or
//	RST) every stream this side opened, and close the connection (Session.Close() sends no
//	GoAway). --allow-resets: streams the peer resets are counted, not failures.
//
// Bench (Go to Go throughput, for benchmarks/): opens --channels `bulk/<size>` streams, then
// times from the first write to the last 0x01 reply: --size bytes per stream in 64 KiB
// writes. Summary {"ok", "ms", "mib_per_s"}. No wire tap.
//
// What hashicorp/yamux df201c7 does that a peer must know (read from its source under
// /usr/share/gocode/src/github.com/hashicorp/yamux):
//   - Stream.Close() sends FIN; after it, Read returns io.EOF as soon as the receive buffer
//     is empty, even though the peer has not sent its FIN. So this driver never reads after
//     Close(): it reads the echo (or a reply of known length) first, then closes. A
//     "half-close, then read the answer" exchange works only with the library as responder.
//   - There is no per-stream reset in the API: the library sends RST only for a SYN that
//     finds the accept backlog full, or that arrives after its own GoAway.
//   - OpenStream blocks while AcceptBacklog (256) opened streams are un-ACKed; AcceptStream
//     sends the ACK (a WindowUpdate with ACK). Session.Close() sends no GoAway.
//   - A frame for a stream it has closed in both directions is logged ("frame for missing
//     stream") and ignored. A window update can cross the stream's FIN on the wire (the
//     peer sent it before it read the FIN): the summary counts those separately.
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

	"github.com/hashicorp/yamux"
)

var (
	keepaliveMs = -1
	backlog     = 256
	minPings    = 0
	goAway      = false
	gate        = false
	hold        = false
	allowResets = false
	noTap       = false
)

// libWatch: the library's log lines the summary counts. The second is the part of the first
// that is a pure window update (no flags): one that crossed the stream's FIN on the wire.
var libWatch = []string{
	"frame for missing stream",
	"frame for missing stream: Vsn:0 Type:1 Flags:0 ",
	"Discarding data for stream",
	"backlog exceeded",
	"[ERR]",
	"[WARN]",
}

func main() {
	p := peer.Start(peer.Spec{
		Name:     "yamux_peer",
		Modes:    []string{"responder", "driver", "bench"},
		Defaults: peer.Options{Channels: 64, Size: 1 << 20, Big: 0, TimeoutMs: 90000},
		Extra: func(fs *flag.FlagSet) {
			fs.IntVar(&keepaliveMs, "keepalive-ms", -1, "keepalive ping interval (0: off; default the library's 30 s)")
			fs.IntVar(&backlog, "backlog", 256, "AcceptBacklog")
			fs.IntVar(&minPings, "min-pings", 0, "driver: wait for this many keepalive pings each way")
			fs.BoolVar(&goAway, "goaway", false, "driver: check that the peer stops opening after our GoAway")
			fs.BoolVar(&gate, "gate", false, "responder: the first stream gates Accept()")
			fs.BoolVar(&hold, "hold", false, "driver: open every stream before writing to any")
			fs.BoolVar(&allowResets, "allow-resets", false, "driver: streams reset by the peer are counted, not failures")
			fs.BoolVar(&noTap, "no-tap", false, "no wire tap")
		},
	})
	p.Run(func(conn net.Conn) bool {
		lib := &peer.LibLog{P: p, Watch: libWatch}
		cfg := yamux.DefaultConfig()
		cfg.AcceptBacklog = backlog
		cfg.LogOutput = lib
		if keepaliveMs == 0 {
			cfg.EnableKeepAlive = false
		} else if keepaliveMs > 0 {
			cfg.KeepAliveInterval = time.Duration(keepaliveMs) * time.Millisecond
		}
		rx, tx := newTap(), newTap()
		if !noTap && p.Opts.Mode != "bench" {
			conn = &peer.TappedConn{Conn: conn, RX: rx, TX: tx}
		}
		var sess *yamux.Session
		var err error
		if p.IsClient() {
			sess, err = yamux.Client(conn, cfg)
		} else {
			sess, err = yamux.Server(conn, cfg)
		}
		if err != nil {
			p.Logf("fatal: %v", err)
			return false
		}
		r := &run{p: p, sess: sess, rx: rx, tx: tx, lib: lib}
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
	sess     *yamux.Session
	rx, tx   *tap
	lib      *peer.LibLog
	fails    peer.Failures
	handled  peer.Counter
	mu       sync.Mutex
	names    []string
	openedBy []uint32 // stream ids this side opened
}

func (r *run) common(summary map[string]interface{}) map[string]interface{} {
	summary["role"] = map[bool]string{true: "client", false: "server"}[r.p.IsClient()]
	summary["transport"] = r.p.Opts.Transport()
	summary["yamux_log"] = r.lib.Counts.Map()
	summary["remote_pings"] = r.rx.pingSYN()
	summary["remote_goaway"] = r.rx.firstGoAway()
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
	gated := gate
	for {
		st, err := r.sess.AcceptStream()
		if err != nil {
			acceptErr = err
			break
		}
		if gated {
			gated = false
			r.gateStream(st, &wg)
			continue
		}
		wg.Add(1)
		go func(st *yamux.Stream) {
			defer wg.Done()
			running.Store(st.StreamID(), "")
			r.respond(st, &running)
			running.Delete(st.StreamID())
		}(st)
	}
	r.p.Logf("accept ended: %v", acceptErr)
	// The session is gone: every stream was force-closed, so every behaviour ends now.
	wg.Wait()
	unfinished := []string{}
	running.Range(func(k, v interface{}) bool {
		unfinished = append(unfinished, fmt.Sprintf("%v %v", k, v))
		return true
	})
	sort.Strings(unfinished)
	accept := ""
	if acceptErr != nil {
		accept = acceptErr.Error()
	}
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
		"accept_error": accept,
	})
	peer.Summary(s)
	return s["ok"].(bool)
}

// gateStream holds Accept() until the gate stream receives a line.
func (r *run) gateStream(st *yamux.Stream, wg *sync.WaitGroup) {
	br := bufio.NewReader(st)
	name, err := peer.ReadLine(br)
	if err != nil || !strings.HasPrefix(name, "gate/") {
		r.fails.Add(r.p, "gate: the first stream must be gate/*, got %q (%v)", name, err)
		st.Close()
		return
	}
	r.handled.Inc("gate")
	if _, err := st.Write([]byte("gated\n")); err != nil {
		r.fails.Add(r.p, "gate: reply: %v", err)
	}
	line, err := peer.ReadLine(br)
	r.p.Logf("gate: %q (%v): accepting again", line, err)
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(io.Discard, br)
		st.Close()
	}()
}

func (r *run) respond(st *yamux.Stream, running *sync.Map) {
	label := fmt.Sprintf("stream %d", st.StreamID())
	br := bufio.NewReaderSize(st, 64*1024)
	name, err := peer.ReadLine(br)
	if err != nil {
		r.fails.Add(r.p, "%s: reading the name line: %v", label, err)
		st.Close()
		return
	}
	running.Store(st.StreamID(), name)
	r.mu.Lock()
	r.names = append(r.names, name)
	r.mu.Unlock()
	label += " " + strconv.Quote(name)
	kind, arg, _ := strings.Cut(name, "/")
	n, numErr := strconv.Atoi(arg)
	fail := func(format string, args ...interface{}) {
		r.fails.Add(r.p, "%s: %s", label, fmt.Sprintf(format, args...))
	}
	switch kind {
	case "echo":
		buf := make([]byte, 64*1024)
		for {
			k, err := br.Read(buf)
			if k > 0 {
				if _, werr := st.Write(buf[:k]); werr != nil {
					fail("echo write: %v", werr)
					break
				}
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				fail("echo read: %v", err)
				break
			}
		}
	case "halfclose":
		total, err := io.Copy(io.Discard, br)
		if err != nil {
			fail("read: %v", err)
		}
		writeOrFail(st, []byte(strconv.FormatInt(total, 10)), fail)
	case "big":
		h := sha256.New()
		var total int64
		if numErr == nil {
			total, err = io.CopyN(h, br, int64(n))
		} else {
			total, err = io.Copy(h, br)
		}
		if err != nil {
			fail("read after %d bytes: %v", total, err)
		}
		writeOrFail(st, []byte(fmt.Sprintf("%d %s", total, hex.EncodeToString(h.Sum(nil)))), fail)
		if numErr == nil {
			waitEOF(br, fail)
		}
	case "bulk":
		if numErr == nil {
			_, err = io.CopyN(io.Discard, br, int64(n))
		} else {
			_, err = io.Copy(io.Discard, br)
		}
		if err != nil {
			fail("read: %v", err)
		}
		writeOrFail(st, []byte{1}, fail)
		if numErr == nil {
			waitEOF(br, fail)
		}
	case "reset":
		if _, err := io.CopyN(io.Discard, br, int64(n)); err != nil {
			fail("read: %v", err)
			break
		}
		writeOrFail(st, []byte("ready\n"), fail)
		_, err := io.Copy(io.Discard, br)
		if errors.Is(err, yamux.ErrConnectionReset) {
			r.handled.Inc("reset_seen")
		} else {
			fail("expected the peer's RST, got %v", err)
		}
	case "goaway":
		if err := r.sess.GoAway(); err != nil {
			fail("GoAway: %v", err)
		}
		writeOrFail(st, []byte("goaway-sent\n"), fail)
		waitEOF(br, fail)
	case "pings":
		syn, ack := r.rx.waitPings(n)
		writeOrFail(st, []byte(fmt.Sprintf("pings %d %d\n", syn, ack)), fail)
		waitEOF(br, fail)
	default:
		kind = "unknown"
	}
	r.handled.Inc(kind)
	st.Close()
}

func writeOrFail(st *yamux.Stream, b []byte, fail func(string, ...interface{})) {
	if _, err := st.Write(b); err != nil {
		fail("write: %v", err)
	}
}

func waitEOF(br *bufio.Reader, fail func(string, ...interface{})) {
	if k, err := io.Copy(io.Discard, br); err != nil || k != 0 {
		fail("expected the FIN, got %d more bytes (%v)", k, err)
	}
}

// ------------------------------------------------------------------ driver

type outcome struct {
	OK    bool   `json:"ok"`
	Reset bool   `json:"reset"`
	ID    uint32 `json:"id"`
	Err   string `json:"err,omitempty"`
}

func (r *run) open(name string) (*yamux.Stream, error) {
	st, err := r.sess.OpenStream()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.openedBy = append(r.openedBy, st.StreamID())
	r.mu.Unlock()
	return st, nil
}

// echo writes data on st (after its name line) while reading the echo back; then Close().
func echo(st *yamux.Stream, name string, data []byte) outcome {
	out := outcome{ID: st.StreamID()}
	errc := make(chan error, 1)
	go func() {
		if _, err := st.Write([]byte(name + "\n")); err != nil {
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
	case errors.Is(rerr, yamux.ErrConnectionReset) || errors.Is(werr, yamux.ErrConnectionReset):
		out.Reset = true
		out.Err = "reset by the peer"
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

	// echo/<i>
	results := make([]outcome, o.Channels)
	start := time.Now()
	streams := make([]*yamux.Stream, o.Channels)
	if hold {
		for i := range streams {
			st, err := r.open(fmt.Sprintf("echo/%d", i))
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
			name := fmt.Sprintf("echo/%d", i)
			st := streams[i]
			if st == nil && !hold {
				var err error
				if st, err = r.open(name); err != nil {
					results[i] = outcome{Err: "OpenStream: " + err.Error()}
					return
				}
			}
			if st == nil {
				results[i] = outcome{Err: "not opened"}
				return
			}
			results[i] = echo(st, name, peer.Pattern(i, o.Size))
		}(i)
	}

	// big/<n>, error/x and a ping, at the same time as the echoes.
	var bigResult, errResult, pingResult map[string]interface{}
	if o.Big > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bigResult = r.bigStream(o.Big)
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		errResult = r.errorStream()
	}()
	go func() {
		defer wg.Done()
		t := time.Now()
		rtt, err := r.sess.Ping()
		pingResult = map[string]interface{}{"rtt_ms": float64(rtt.Microseconds()) / 1000, "wall_ms": time.Since(t).Milliseconds()}
		if err != nil {
			r.fails.Add(r.p, "ping: %v", err)
		}
	}()
	wg.Wait()
	echoMs := time.Since(start)

	okCount, resetCount := 0, 0
	ids := []uint32{}
	for i, res := range results {
		switch {
		case res.OK:
			okCount++
		case res.Reset && allowResets:
			resetCount++
		default:
			if res.Reset {
				resetCount++
			}
			r.fails.Add(r.p, "echo/%d (stream %d): %s", i, res.ID, res.Err)
		}
		if res.OK && len(ids) < 4 {
			ids = append(ids, res.ID)
		}
	}
	summary["echo_ok"] = okCount
	summary["echo_reset"] = resetCount
	summary["echo_ms"] = echoMs.Milliseconds()
	summary["echo_mib_per_s"] = peer.MiBPerS(2*int64(okCount)*int64(o.Size), echoMs)
	summary["stream_ids"] = ids
	summary["big"] = bigResult
	summary["error_stream"] = errResult
	summary["ping"] = pingResult

	if goAway {
		summary["goaway_check"] = r.goAwayCheck()
	}
	if minPings > 0 {
		syn, ack := r.rx.waitPings(minPings)
		if syn < minPings || ack < minPings {
			r.fails.Add(r.p, "keepalive: %d pings received and %d answers, want %d each", syn, ack, minPings)
		}
		summary["pings_seen"] = map[string]int{"syn": syn, "ack": ack}
	}
	// Every stream we opened must have been ended by the peer (FIN, or RST).
	r.mu.Lock()
	opened := append([]uint32{}, r.openedBy...)
	r.mu.Unlock()
	if missing := r.rx.waitEnded(opened); len(missing) > 0 {
		r.fails.Add(r.p, "the connection ended before the peer ended %d of our streams (first: %d)", len(missing), missing[0])
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
	st, err := r.open("big")
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

func (r *run) errorStream() map[string]interface{} {
	st, err := r.open("error")
	if err != nil {
		r.fails.Add(r.p, "error: OpenStream: %v", err)
		return nil
	}
	if _, err := st.Write([]byte("error/x\n")); err != nil && !errors.Is(err, yamux.ErrConnectionReset) {
		r.fails.Add(r.p, "error: write: %v", err)
	}
	k, err := io.Copy(io.Discard, st)
	st.Close()
	if !errors.Is(err, yamux.ErrConnectionReset) {
		r.fails.Add(r.p, "error/x: expected the peer's RST, got %d bytes then %v", k, err)
	}
	return map[string]interface{}{"bytes": k, "err": fmt.Sprint(err)}
}

// goAwayCheck: after our GoAway the peer must refuse to open streams (it says so on a stream
// opened before the GoAway).
func (r *run) goAwayCheck() string {
	st, err := r.open("goawaycheck")
	if err != nil {
		r.fails.Add(r.p, "goawaycheck: OpenStream: %v", err)
		return ""
	}
	defer st.Close()
	if _, err := st.Write([]byte("goawaycheck/x\n")); err != nil {
		r.fails.Add(r.p, "goawaycheck: write: %v", err)
		return ""
	}
	if err := r.sess.GoAway(); err != nil {
		r.fails.Add(r.p, "GoAway: %v", err)
	}
	if _, err := st.Write([]byte("sent\n")); err != nil {
		r.fails.Add(r.p, "goawaycheck: write: %v", err)
		return ""
	}
	reply, err := peer.ReadLine(bufio.NewReader(st))
	if err != nil || !strings.HasPrefix(reply, "refused") {
		r.fails.Add(r.p, "goawaycheck: the peer should refuse to open after our GoAway; it said %q (%v)", reply, err)
	}
	return reply
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
		"channels":   o.Channels,
		"size":       o.Size,
		"ms":         float64(elapsed.Microseconds()) / 1000,
		"mib_per_s":  peer.MiBPerS(total, elapsed),
		"yamux_log":  r.lib.Counts.Map(),
		"failures":   failures,
		"elapsed_ms": r.p.ElapsedMs(),
	})
	return len(failures) == 0
}

// ------------------------------------------------------------------ wire tap

// tap decodes yamux frame headers from the raw bytes of one direction, independently of the
// library, for the summary; the receiving tap also lets the driver wait for the peer's FIN
// or RST on its streams and for keepalive pings.
type tap struct {
	mu     sync.Mutex
	cond   *sync.Cond
	hdr    [12]byte
	have   int
	skip   uint32
	s      tapStats
	ended  map[uint32]bool
	closed bool // the connection ended: waits give up
}

type tapStats struct {
	Frames       int64          `json:"frames"`
	Bytes        int64          `json:"bytes"`
	Kinds        map[string]int `json:"kinds"`
	DataBytes    int64          `json:"data_bytes"`
	DataFrameMax uint32         `json:"data_frame_max"`
	WUCount      int            `json:"wu_count"`
	WUDeltaMax   uint32         `json:"wu_delta_max"`
	PingCount    map[string]int `json:"ping_count"`
	GoAway       []uint32       `json:"goaway"`
	Bad          int            `json:"bad"`
}

func newTap() *tap {
	t := &tap{ended: map[uint32]bool{}}
	t.s.Kinds = map[string]int{}
	t.s.PingCount = map[string]int{"SYN": 0, "ACK": 0, "other": 0}
	t.s.GoAway = []uint32{}
	t.cond = sync.NewCond(&t.mu)
	return t
}

var typeNames = []string{"Data", "WindowUpdate", "Ping", "GoAway"}

func flagText(f uint16) string {
	var n []string
	for i, name := range []string{"SYN", "ACK", "FIN", "RST"} {
		if f&(1<<i) != 0 {
			n = append(n, name)
		}
	}
	if f&^15 != 0 {
		n = append(n, fmt.Sprintf("0x%x", f&^15))
	}
	return strings.Join(n, "|")
}

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
			t.skip -= k
			b = b[k:]
			continue
		}
		k := copy(t.hdr[t.have:], b)
		t.have += k
		b = b[k:]
		if t.have < 12 {
			break
		}
		t.have = 0
		t.frame()
	}
	t.cond.Broadcast()
}

func (t *tap) frame() {
	h := t.hdr[:]
	ver, typ := h[0], h[1]
	flags := binary.BigEndian.Uint16(h[2:])
	id := binary.BigEndian.Uint32(h[4:])
	length := binary.BigEndian.Uint32(h[8:])
	s := &t.s
	s.Frames++
	name := fmt.Sprintf("type%d", typ)
	if int(typ) < len(typeNames) {
		name = typeNames[typ]
	}
	if ver != 0 || typ > 3 {
		s.Bad++
	}
	key := name
	if flags != 0 {
		key += "+" + flagText(flags)
	}
	s.Kinds[key]++
	if flags&(4|8) != 0 && typ <= 1 {
		t.ended[id] = true
	}
	switch typ {
	case 0:
		s.DataBytes += int64(length)
		if length > s.DataFrameMax {
			s.DataFrameMax = length
		}
		t.skip = length
	case 1:
		s.WUCount++
		if length > s.WUDeltaMax {
			s.WUDeltaMax = length
		}
	case 2:
		switch flags {
		case 1:
			s.PingCount["SYN"]++
		case 2:
			s.PingCount["ACK"]++
		default:
			s.PingCount["other"]++
		}
	case 3:
		s.GoAway = append(s.GoAway, length)
	}
}

func (t *tap) Close() {
	t.mu.Lock()
	t.closed = true
	t.cond.Broadcast()
	t.mu.Unlock()
}

// waitEnded waits (bounded by the watchdog) until a FIN or RST arrived for every id, or the
// connection ended; returns the ids that got neither.
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

// waitPings waits until k Ping|SYN and k Ping|ACK were received (or the connection ended);
// returns both counts.
func (t *tap) waitPings(k int) (int, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for (t.s.PingCount["SYN"] < k || t.s.PingCount["ACK"] < k) && !t.closed {
		t.cond.Wait()
	}
	return t.s.PingCount["SYN"], t.s.PingCount["ACK"]
}

func (t *tap) pingSYN() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.s.PingCount["SYN"]
}

func (t *tap) firstGoAway() interface{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.s.GoAway) == 0 {
		return nil
	}
	return t.s.GoAway[0]
}

func (t *tap) snapshot() tapStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.s
	s.Kinds = map[string]int{}
	for k, v := range t.s.Kinds {
		s.Kinds[k] = v
	}
	s.PingCount = map[string]int{}
	for k, v := range t.s.PingCount {
		s.PingCount[k] = v
	}
	s.GoAway = append([]uint32{}, t.s.GoAway...)
	return s
}
