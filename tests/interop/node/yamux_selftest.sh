#!/usr/bin/env bash
# Self-test of yamux_peer.mjs: npm @chainsafe/libp2p-yamux against itself.
# For each transport (tcp, unix) start a `--listen --mode responder` peer (yamux
# server, even ids), then a `--connect --mode driver` peer (client, odd ids), and
# require both to exit 0.
#
# usage: tests/interop/node/yamux_selftest.sh [--size BYTES] [--channels N] [--big BYTES]
set -u
cd "$(dirname "$0")"

SIZE=1048576
CHANNELS=64
BIG=33554432
while [ $# -gt 0 ]; do
	case "$1" in
		--size) SIZE="$2"; shift 2 ;;
		--channels) CHANNELS="$2"; shift 2 ;;
		--big) BIG="$2"; shift 2 ;;
		*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
done

if [ ! -d node_modules/@chainsafe/libp2p-yamux ]; then
	npm ci --no-audit --no-fund >&2 || exit 2
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0

now_ms() { date +%s%3N; }

for t in tcp unix; do
	label="yamux/$t"
	if [ "$t" = tcp ]; then listen_arg=(--tcp 0); else listen_arg=(--unix "$TMP/yamux.sock"); fi
	start=$(now_ms)
	node yamux_peer.mjs --listen "${listen_arg[@]}" --mode responder --timeout-ms 90000 \
		>"$TMP/resp.out" 2>"$TMP/resp.err" &
	rpid=$!
	addr=""
	for _ in $(seq 1 200); do
		addr=$(sed -n 's/^LISTENING //p' "$TMP/resp.out" | head -n1)
		[ -n "$addr" ] && break
		sleep 0.05
	done
	if [ -z "$addr" ]; then
		echo "FAIL $label: responder did not report LISTENING"; cat "$TMP/resp.err"
		kill "$rpid" 2>/dev/null; wait "$rpid" 2>/dev/null
		failed=$((failed + 1)); continue
	fi
	if [ "$t" = tcp ]; then conn_arg=(--tcp "$addr"); else conn_arg=(--unix "$addr"); fi
	node yamux_peer.mjs --connect "${conn_arg[@]}" --mode driver \
		--channels "$CHANNELS" --size "$SIZE" --big "$BIG" --timeout-ms 90000 >"$TMP/drv.out" 2>"$TMP/drv.err"
	drc=$?
	wait "$rpid"
	rrc=$?
	ms=$(($(now_ms) - start))
	if [ "$drc" -eq 0 ] && [ "$rrc" -eq 0 ]; then
		brief=$(node -e '
			const d = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").pop())
			const r = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8").trim().split("\n").pop())
			console.log(`echo ${d.echo_ok}/${d.channels} in ${d.echo_ms} ms (${d.echo_mib_per_s} MiB/s), ` +
				`big ${d.big_mib_per_s} MiB/s, ping ${d.ping_idle && d.ping_idle.rtt_ms} ms, ` +
				`error -> ${d.error_stream && d.error_stream.error_name}, goaway sent ${JSON.stringify(d.goaway_sent)}, ` +
				`responder: remote_pings ${r.remote_pings}, remote_goaway ${r.remote_goaway}, ended_by "${r.ended_by}"`)
		' "$TMP/drv.out" "$TMP/resp.out" 2>/dev/null || tail -n1 "$TMP/drv.out")
		echo "PASS $label (${ms} ms): $brief"
		passed=$((passed + 1))
	else
		echo "FAIL $label (${ms} ms): driver rc=$drc responder rc=$rrc"
		echo "--- driver stdout"; cut -c1-2000 "$TMP/drv.out"
		echo "--- driver stderr"; tail -n 40 "$TMP/drv.err"
		echo "--- responder stdout"; cut -c1-2000 "$TMP/resp.out"
		echo "--- responder stderr"; tail -n 40 "$TMP/resp.err"
		failed=$((failed + 1))
	fi
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
