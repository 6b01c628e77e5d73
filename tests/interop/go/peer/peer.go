// Package peer holds what the Go interop peers share (yamux_peer now, smux_peer later):
// the command line, the process guards (watchdog, exit codes, unix socket cleanup), the one
// connection over TCP or a unix socket, the stdout conventions, the data helpers and a log
// writer that counts the library's warnings.
//
// Conventions (the Python tests depend on them; the same as the Node peers' common.mjs):
//
//	stdout: `LISTENING <port|path>` (--listen only), then one JSON summary line ({"ok":...}).
//	        Everything else goes to stderr.
//	exit:   0 success, 1 a check failed / unexpected error, 2 bad usage, 3 watchdog.
//
// Built by the tests with `GOPATH=/usr/share/gocode GO111MODULE=off go build` against the
// Debian packages of the Go libraries (tests/interop/gobuild.py); this package is imported
// by a relative path ("../peer"), which GOPATH mode allows outside GOPATH.
package peer

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// Options is the parsed command line. The common flags are the Node peers' ones:
//
//	--listen|--connect --tcp PORT|--unix PATH --mode responder|driver
//	[--channels N] [--size BYTES] [--big BYTES] [--timeout-ms MS]
type Options struct {
	Role      string // "listen" or "connect"
	TCP       int    // port (--listen --tcp 0: any free port)
	Unix      string // unix socket path ("" for TCP)
	Mode      string
	Channels  int
	Size      int
	Big       int
	TimeoutMs int
}

// Transport is "tcp" or "unix".
func (o *Options) Transport() string {
	if o.Unix != "" {
		return "unix"
	}
	return "tcp"
}

// Peer is this process: its options, start time and log tag.
type Peer struct {
	Name  string
	Opts  Options
	T0    time.Time
	Tag   string
	logMu sync.Mutex
}

// Spec describes one peer program for Start.
type Spec struct {
	Name     string
	Modes    []string // allowed --mode values
	Defaults Options  // Channels, Size, Big, TimeoutMs
	// Extra registers the peer's own flags on the flag set before parsing.
	Extra func(fs *flag.FlagSet)
}

var unixToRemove string

// Start parses the command line (exit 2 on bad usage) and arms the watchdog (exit 3 after
// --timeout-ms).
func Start(spec Spec) *Peer {
	p := &Peer{Name: spec.Name, T0: time.Now()}
	o := &p.Opts
	fs := flag.NewFlagSet(spec.Name, flag.ContinueOnError)
	listen := fs.Bool("listen", false, "listen on 127.0.0.1 or the unix path; accept ONE connection")
	connect := fs.Bool("connect", false, "connect")
	fs.IntVar(&o.TCP, "tcp", -1, "TCP port")
	fs.StringVar(&o.Unix, "unix", "", "unix socket path")
	fs.StringVar(&o.Mode, "mode", "", strings.Join(spec.Modes, "|"))
	fs.IntVar(&o.Channels, "channels", spec.Defaults.Channels, "streams the driver opens")
	fs.IntVar(&o.Size, "size", spec.Defaults.Size, "bytes per stream")
	fs.IntVar(&o.Big, "big", spec.Defaults.Big, "bytes of the single big stream (0: none)")
	fs.IntVar(&o.TimeoutMs, "timeout-ms", spec.Defaults.TimeoutMs, "watchdog (exit 3)")
	if spec.Extra != nil {
		spec.Extra(fs)
	}
	usage := func(msg string) {
		if msg != "" {
			fmt.Fprintf(os.Stderr, "%s: %s\n", spec.Name, msg)
		}
		fs.Usage()
		os.Exit(2)
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		usage("")
	}
	if fs.NArg() > 0 {
		usage("unexpected argument " + fs.Arg(0))
	}
	switch {
	case *listen == *connect:
		usage("exactly one of --listen/--connect is required")
	case *listen:
		o.Role = "listen"
	default:
		o.Role = "connect"
	}
	if (o.TCP < 0) == (o.Unix == "") {
		usage("exactly one of --tcp/--unix is required")
	}
	ok := false
	for _, m := range spec.Modes {
		ok = ok || m == o.Mode
	}
	if !ok {
		usage("--mode must be one of " + strings.Join(spec.Modes, ", "))
	}
	if o.Channels < 0 || o.Size < 0 || o.Big < 0 || o.TimeoutMs <= 0 {
		usage("--channels, --size and --big must be >= 0, --timeout-ms > 0")
	}
	side := "server"
	if o.Role == "connect" {
		side = "client"
	}
	p.Tag = fmt.Sprintf("[%s %s %s]", spec.Name, side, o.Mode)
	time.AfterFunc(time.Duration(o.TimeoutMs)*time.Millisecond, func() {
		p.Logf("TIMEOUT: watchdog fired after %d ms", o.TimeoutMs)
		cleanup()
		os.Exit(3)
	})
	return p
}

// IsClient reports whether this side connects (the multiplexing client).
func (p *Peer) IsClient() bool { return p.Opts.Role == "connect" }

// Logf writes one line to stderr.
func (p *Peer) Logf(format string, args ...interface{}) {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	fmt.Fprintf(os.Stderr, "%s +%dms %s\n", p.Tag, time.Since(p.T0).Milliseconds(), fmt.Sprintf(format, args...))
}

// ElapsedMs is the time since Start.
func (p *Peer) ElapsedMs() int64 { return time.Since(p.T0).Milliseconds() }

// Summary writes the JSON summary line on stdout.
func Summary(v interface{}) {
	data, err := json.Marshal(v)
	if err != nil {
		data = []byte(fmt.Sprintf(`{"ok":false,"failures":[%q]}`, "summary: "+err.Error()))
	}
	os.Stdout.Write(append(data, '\n'))
}

func cleanup() {
	if unixToRemove != "" {
		os.Remove(unixToRemove)
		unixToRemove = ""
	}
}

// Run gets the one connection (--listen prints LISTENING and accepts ONE connection;
// --connect connects), runs body and exits 0 if it returns true, else 1.
func (p *Peer) Run(body func(conn net.Conn) bool) {
	conn, err := p.connection()
	if err != nil {
		p.Logf("fatal: %v", err)
		cleanup()
		os.Exit(1)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		tcp.SetNoDelay(true)
	}
	ok := body(conn)
	cleanup()
	if ok {
		p.Logf("success")
		os.Exit(0)
	}
	p.Logf("FAILED")
	os.Exit(1)
}

func (p *Peer) connection() (net.Conn, error) {
	o := &p.Opts
	if o.Role == "connect" {
		if o.Unix != "" {
			return net.Dial("unix", o.Unix)
		}
		return net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", o.TCP))
	}
	var ln net.Listener
	var err error
	var where string
	if o.Unix != "" {
		if st, serr := os.Stat(o.Unix); serr == nil && st.Mode()&os.ModeSocket != 0 {
			os.Remove(o.Unix)
		}
		ln, err = net.Listen("unix", o.Unix)
		if err != nil {
			return nil, err
		}
		unixToRemove = o.Unix
		where = o.Unix
	} else {
		ln, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", o.TCP))
		if err != nil {
			return nil, err
		}
		where = fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	}
	fmt.Fprintf(os.Stdout, "LISTENING %s\n", where)
	conn, err := ln.Accept()
	ln.Close() // ONE connection only
	if err == nil {
		p.Logf("accepted connection")
	}
	return conn, err
}

// Failures collects failed checks (safe for concurrent use).
type Failures struct {
	mu   sync.Mutex
	list []string
}

// Add records one failure (and logs it).
func (f *Failures) Add(p *Peer, format string, args ...interface{}) {
	msg := fmt.Sprintf(format, args...)
	p.Logf("FAIL %s", msg)
	f.mu.Lock()
	f.list = append(f.list, msg)
	f.mu.Unlock()
}

// List returns the failures so far (never nil, for the JSON summary).
func (f *Failures) List() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string{}, f.list...)
}

// Counter counts named events (safe for concurrent use).
type Counter struct {
	mu sync.Mutex
	m  map[string]int
}

// Inc adds one to name.
func (c *Counter) Inc(name string) {
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[name]++
	c.mu.Unlock()
}

// Get returns the count of name.
func (c *Counter) Get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[name]
}

// Map returns a copy of the counts.
func (c *Counter) Map() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.m {
		out[k] = v
	}
	return out
}

// LibLog is the io.Writer given to the library as its log output: it forwards every line to
// stderr (the library logs synchronously from its receive loop: whoever runs this process
// must drain stderr) and counts the lines that contain one of Watch.
type LibLog struct {
	P      *Peer
	Watch  []string
	Counts Counter
	mu     sync.Mutex
}

func (l *LibLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		for _, w := range l.Watch {
			if strings.Contains(line, w) {
				l.Counts.Inc(w)
			}
		}
		l.P.Logf("lib: %s", line)
	}
	return len(b), nil
}

// Pattern is the bytes sent on stream <index>: byte j = (j*31 + index*7) & 0xff (the same
// formula as the Node peers and tests/interop/peers.py).
func Pattern(index, size int) []byte {
	b := make([]byte, size)
	for j := range b {
		b[j] = byte(j*31 + index*7)
	}
	return b
}

// WriteAll writes data in 64 KiB pieces (one stream write each, as the Node peers do).
func WriteAll(w io.Writer, data []byte) error {
	const piece = 64 * 1024
	for off := 0; off < len(data); off += piece {
		end := off + piece
		if end > len(data) {
			end = len(data)
		}
		if _, err := w.Write(data[off:end]); err != nil {
			return fmt.Errorf("write at %d of %d: %w", off, len(data), err)
		}
	}
	return nil
}

// ReadLine reads one line ending in '\n' (at most 4096 bytes) from r, without the newline.
func ReadLine(r *bufio.Reader) (string, error) {
	var sb strings.Builder
	for sb.Len() < 4096 {
		c, err := r.ReadByte()
		if err != nil {
			return sb.String(), err
		}
		if c == '\n' {
			return sb.String(), nil
		}
		sb.WriteByte(c)
	}
	return sb.String(), fmt.Errorf("line longer than 4096 bytes")
}

// MiBPerS is size bytes over ms milliseconds.
func MiBPerS(size int64, d time.Duration) float64 {
	s := d.Seconds()
	if s <= 0 {
		s = 1e-6
	}
	return float64(size) / (1 << 20) / s
}

// Feeder takes the bytes of one direction of a connection (a peer's wire tap).
type Feeder interface {
	Feed(b []byte)
	// Close: the connection ended (waits on the tap give up).
	Close()
}

// TappedConn hands every byte read to RX and every byte written to TX (taps independent of
// the library); RX is closed when reading fails.
type TappedConn struct {
	net.Conn
	RX, TX Feeder
}

func (c *TappedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.RX.Feed(b[:n])
	}
	if err != nil {
		c.RX.Close()
	}
	return n, err
}

func (c *TappedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.TX.Feed(b[:n])
	}
	return n, err
}

// Bulk is the bench mode's transfer (Go to Go throughput): open (the library's OpenStream)
// --channels streams named `bulk/<size>`, then, timed, write --size bytes on each in 64 KiB
// writes and wait for each one's 0x01 reply. Failures go to fails. Returns the time and the
// streams opened (the caller closes them, then the session).
func Bulk(p *Peer, fails *Failures, open func() (io.ReadWriteCloser, error)) (time.Duration, []io.ReadWriteCloser) {
	o := p.Opts
	streams := make([]io.ReadWriteCloser, 0, o.Channels)
	for i := 0; i < o.Channels; i++ {
		st, err := open()
		if err == nil {
			_, err = st.Write([]byte(fmt.Sprintf("bulk/%d\n", o.Size)))
		}
		if err != nil {
			fails.Add(p, "bulk/%d: open: %v", i, err)
			break
		}
		streams = append(streams, st)
	}
	buf := make([]byte, 64*1024)
	var wg sync.WaitGroup
	start := time.Now()
	for i, st := range streams {
		wg.Add(1)
		go func(i int, st io.ReadWriteCloser) {
			defer wg.Done()
			for left := o.Size; left > 0; {
				k := len(buf)
				if k > left {
					k = left
				}
				if _, err := st.Write(buf[:k]); err != nil {
					fails.Add(p, "bulk/%d: write: %v", i, err)
					return
				}
				left -= k
			}
			var one [1]byte
			if _, err := io.ReadFull(st, one[:]); err != nil || one[0] != 1 {
				fails.Add(p, "bulk/%d: no confirmation (%v)", i, err)
			}
		}(i, st)
	}
	wg.Wait()
	return time.Since(start), streams
}
