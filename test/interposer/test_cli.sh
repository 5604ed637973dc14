#!/bin/sh
# test_cli.sh: the "done when" of issue 4. The vmm_share workload (a parent
# and two children sharing VMM memory through POSIX FDs) runs under
# `cuinterpose run` exactly as without it, and `cuinterpose inspect` shows
# the shared allocations, their mappings and their creator. Runs inside
# run-test.sh (fake driver, private socket directory).
set -u
fail() { echo "FAIL: $*"; [ -n "${wl:-}" ] && kill "$wl" 2>/dev/null; exit 1; }
cli=$CUIP_CLI
workload=$CUIP_WORKLOAD
export CUINTERPOSE_LIB=$CUIP_LIB
[ -n "${CUIP_ASAN_RT:-}" ] && export LD_PRELOAD=$CUIP_ASAN_RT

"$cli" --help >/dev/null || fail "--help"
"$cli" bogus >/dev/null 2>&1 && fail "unknown command accepted"
"$cli" run >/dev/null 2>&1; [ $? -eq 2 ] || fail "run without a command is a usage error"
"$cli" inspect 999999 >/dev/null 2>&1; [ $? -eq 1 ] || fail "inspect of a missing process"

# Without the interposer, then with it: the same result.
"$workload" --once -n 2 >"$CUIP_TMP/plain.out" 2>&1 || { cat "$CUIP_TMP/plain.out"; fail "workload alone"; }
"$cli" run -- "$workload" --once -n 2 >"$CUIP_TMP/ip.out" 2>&1 || { cat "$CUIP_TMP/ip.out"; fail "workload under cuinterpose run"; }
cmp "$CUIP_TMP/plain.out" "$CUIP_TMP/ip.out" || fail "output differs under the interposer"

# exec keeps the PID: the process inspected is the one started.
"$cli" run -- sh -c 'echo $$; exec sleep 0' >/dev/null || fail "run keeps the pid"

# A waiting job: inspect the parent and a child.
rm -f "$CUIP_TMP/ready"
"$cli" run -- "$workload" -n 2 -r "$CUIP_TMP/ready" -o "$CUIP_TMP/result" &
wl=$!
i=0
while [ ! -s "$CUIP_TMP/ready" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
[ -s "$CUIP_TMP/ready" ] || fail "workload not ready"
read -r parent child1 child2 <"$CUIP_TMP/ready"
[ "$parent" = "$wl" ] || fail "cuinterpose run changed the pid ($wl -> $parent)"
"$cli" inspect "$parent" >"$CUIP_TMP/parent.txt" || fail "inspect parent"
"$cli" inspect "$child1" --json >"$CUIP_TMP/child.json" || fail "inspect child"
cat "$CUIP_TMP/parent.txt"
n=$(grep -c "owner shared  origin vmm-create  creator this process" "$CUIP_TMP/parent.txt")
[ "$n" -eq 3 ] || fail "parent shows $n shared allocations, expected 3"
grep -q "owner native  origin vmm-create" "$CUIP_TMP/parent.txt" || fail "never-shared VMM not native"
grep -q "access .* device 0  rw" "$CUIP_TMP/parent.txt" || fail "no access shown"
grep -q "phase ACTIVE" "$CUIP_TMP/parent.txt" || fail "phase"
n=$(grep -o '"origin":"vmm-import"' "$CUIP_TMP/child.json" | wc -l)
[ "$n" -eq 3 ] || fail "child shows $n imported allocations, expected 3"
grep -q "\"creator_pid\":$parent" "$CUIP_TMP/child.json" || fail "child does not name its creator"
grep -q '"mappings":\[{' "$CUIP_TMP/child.json" || fail "child mappings"
kill -USR1 "$parent"
i=0
while ! grep -q "round 1" "$CUIP_TMP/result" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
grep -q "round 1 ok" "$CUIP_TMP/result" || { cat "$CUIP_TMP/result"; fail "round 1"; }
kill -TERM "$parent"
wait "$wl" || fail "workload exit status"
# Sockets are removed on exit.
[ -z "$(ls "$CUINTERPOSE_SOCKET_DIR" 2>/dev/null)" ] || fail "stale sockets: $(ls "$CUINTERPOSE_SOCKET_DIR")"
echo "PASS"
