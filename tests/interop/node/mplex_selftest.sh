#!/usr/bin/env bash
# Self-test of mplex_peer.mjs: each npm implementation against itself.
# For each implementation (multiplex, libp2p) and transport (tcp, unix) start a
# `--listen --mode responder` peer, then a `--connect --mode driver` peer of the
# same implementation, and require both to exit 0.
#
# usage: tests/interop/node/mplex_selftest.sh [--size BYTES] [--channels N] [--big BYTES]
set -u
cd "$(dirname "$0")"

SIZE=1048576
CHANNELS=32
BIG=5242880
while [ $# -gt 0 ]; do
	case "$1" in
		--size) SIZE="$2"; shift 2 ;;
		--channels) CHANNELS="$2"; shift 2 ;;
		--big) BIG="$2"; shift 2 ;;
		*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
done

if [ ! -d node_modules/multiplex ] || [ ! -d node_modules/@libp2p/mplex ]; then
	npm ci --no-audit --no-fund >&2 || exit 2
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0

now_ms() { date +%s%3N; }

for impl in multiplex libp2p; do
	for t in tcp unix; do
		label="$impl/$t"
		if [ "$t" = tcp ]; then listen_arg=(--tcp 0); else listen_arg=(--unix "$TMP/mplex-$impl.sock"); fi
		start=$(now_ms)
		node mplex_peer.mjs --impl "$impl" --listen "${listen_arg[@]}" --mode responder --timeout-ms 60000 \
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
		node mplex_peer.mjs --impl "$impl" --connect "${conn_arg[@]}" --mode driver \
			--channels "$CHANNELS" --size "$SIZE" --big "$BIG" --timeout-ms 60000 >"$TMP/drv.out" 2>"$TMP/drv.err"
		drc=$?
		wait "$rpid"
		rrc=$?
		ms=$(($(now_ms) - start))
		if [ "$drc" -eq 0 ] && [ "$rrc" -eq 0 ]; then
			echo "PASS $label (${ms} ms): $(tail -n1 "$TMP/drv.out")"
			passed=$((passed + 1))
		else
			echo "FAIL $label (${ms} ms): driver rc=$drc responder rc=$rrc"
			echo "--- driver stdout"; cat "$TMP/drv.out"
			echo "--- driver stderr"; tail -n 40 "$TMP/drv.err"
			echo "--- responder stdout"; cat "$TMP/resp.out"
			echo "--- responder stderr"; tail -n 40 "$TMP/resp.err"
			failed=$((failed + 1))
		fi
	done
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
