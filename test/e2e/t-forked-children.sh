# Children forked from a CUDA process after cuInit (DataLoader workers,
# compile workers, helpers), on the fake driver's device node (a loop
# device each CUDA process maps and holds, as /dev/nvidia* on NVIDIA's
# driver; test/fakecuda/devnode.c):
# - the fake is faithful: a forked child and its own child inherit the
#   node's mapping and descriptor, their CUDA calls answer
#   CUDA_ERROR_NOT_INITIALIZED (3), and criu alone cannot dump them
#   ("Can't handle non-regular mapping on PID's map ADDR");
# - with the plugin, two dump + restore cycles: both helpers are named in
#   the first dump's log (mappings, descriptors, "forked after cuInit"),
#   come back with their pids, the node's mapping is /dev/zero memory at the
#   same address and size, the descriptor is /dev/null at the same number,
#   their CUDA calls answer as before; the second dump finds nothing of the
#   driver's left in them; the job's bytes, addresses and sharing are
#   intact;
# - a helper that maps another device (a second loop device) is refused at
#   PAUSE_DEVICES, before anything changes, naming its pid, the device and
#   the address; the job keeps running.
. "$srcdir/lib.sh"
. "$srcdir/lib-proc.sh"

command -v losetup >/dev/null || skip "losetup (util-linux) not installed"
NODE=$(losetup -f 2>/dev/null) || skip "no free loop device for the fake driver's device node"
export FAKECUDA_DEVNODE=$NODE
# a second device, not the driver's, for the helper to map at the end
for n in $(seq 0 63); do
	[ -b "/dev/loop$n" ] && [ "/dev/loop$n" != "$NODE" ] && ! losetup "/dev/loop$n" >/dev/null 2>&1 &&
		E2E_OTHER_DEVICE=/dev/loop$n && break
done
[ -n "${E2E_OTHER_DEVICE:-}" ] || skip "no second free loop device"
export E2E_OTHER_DEVICE

start_proc 3
R0=$(rank_pid 0)
grep -q " $NODE\$" /proc/"$R0"/maps || fail "rank 0 does not map the device node $NODE: $(grep loop /proc/"$R0"/maps)"
cmd 3 verify 0
before=$(answers 3)
cmd 3 fork 2
wait_file "$T/w/forked1.ready"
wait_file "$T/w/forked2.ready"
H1=$(awk '{print $2}' "$T/w/forked1.ready")
H2=$(awk '{print $2}' "$T/w/forked2.ready")
[ "$(awk '{print $4}' /proc/"$H2"/stat)" = "$H1" ] || fail "the second helper $H2 is not the first one's child"

# node_map PID: the node's (or its replacement's) mapping: "START-END PERMS"
node_map() { awk -v n="$2" '$6 == n {print $1, $2; exit}' /proc/"$1"/maps; }
# inert_map PID "START-END PERMS": the mapping at that range if /dev/zero
# memory backs it (criu's second restore makes it a memfd of that name)
inert_map() {
	awk -v r="${2%% *}" '$1 == r && ($6 == "/dev/zero" || $6 == "/memfd:/dev/zero") {print $1, $2}' /proc/"$1"/maps
}
# node_fd PID TARGET: the descriptor numbers of PID that point at TARGET
node_fd() { for f in /proc/"$1"/fd/*; do [ "$(readlink "$f")" = "$2" ] && echo "${f##*/}"; done | sort -n | tr '\n' ' '; }
# cuda_answers D: what helper D's CUDA calls answered, after a SIGUSR1
cuda_answers() {
	local n=0 p=$1 f=$T/w/forked$2.cuda
	[ -f "$f" ] && n=$(wc -l <"$f")
	kill -USR1 "$p"
	for _ in $(seq 200); do [ "$(wc -l 2>/dev/null <"$f" || echo 0)" -gt "$n" ] && break; nap 0.05; done
	tail -n 1 "$f" 2>/dev/null
}

for h in "$H1" "$H2"; do
	[ -n "$(node_map "$h" "$NODE")" ] || fail "helper $h does not map $NODE (it inherits it from a real driver)"
	[ -n "$(node_fd "$h" "$NODE")" ] || fail "helper $h holds no descriptor of $NODE"
done
MAP1=$(node_map "$H1" "$NODE")
MAP2=$(node_map "$H2" "$NODE")
FD1=$(node_fd "$H1" "$NODE")
A1=$(cuda_answers "$H1" 1)
A2=$(cuda_answers "$H2" 2)
[ "$A1" = "cuInit 3 cuDeviceGet 3 cuMemAlloc 3" ] || fail "helper 1's CUDA answered: '$A1'"
[ "$A2" = "$A1" ] || fail "helper 2's CUDA answered: '$A2'"

note "criu alone cannot dump a forked helper"
mkdir -p "$T/plain" "$T/noplugins"
bounded $SAN_CRIU "$CRIU" dump -t "$H1" -D "$T/plain" -L "$T/noplugins" --leave-running \
	--shell-job -v4 -o dump.log >/dev/null 2>&1 && fail "criu dumped the forked helper without the plugin"
grep -Eq "Can't handle non-regular mapping on $H1's map|Can't dump file .* unknown" "$T/plain/dump.log" ||
	fail "criu failed otherwise: $(grep Error "$T/plain/dump.log" | head -n 3)"
alive "$H1" || fail "the helper died in the failed dump"

for c in 1 2; do
	note "cycle $c"
	criu_dump "$T/d$c" || fail "criu dump $c"
	if [ $c = 1 ]; then
		for h in "$H1" "$H2"; do
			has_line "$T/d$c/dump.log" "pid $h \(e2e_proc\) holds [0-9]+ mapping\(s\).*and [0-9]+ descriptor\(s\) of the driver's devices \($NODE\) but is no CUDA process to the driver \(forked after cuInit\)" \
				"helper $h not named"
		done
		has_line "$T/d$c/dump.log" "mappings of $NODE \(a driver device\) held by a process the driver does not know: claimed" \
			"the node's mappings were not claimed"
		[ -s "$T/d$c/cuinterpose-devmaps.img" ] || fail "no cuinterpose-devmaps.img"
		ls "$T/d$c"/cuinterpose-devfile-*.img >/dev/null 2>&1 || fail "no descriptor image"
	else
		# restored inert, the helpers hold nothing of the driver's any more
		grep -q "forked after cuInit" "$T/d$c/dump.log" && fail "a restored helper still counts as holding the driver's devices"
		[ -e "$T/d$c/cuinterpose-devmaps.img" ] && fail "mappings claimed again"
	fi
	wait_gone $(job_pids) "$H1" "$H2" || fail "the dumped job did not exit"
	criu_restore "$T/d$c" || fail "criu restore $c"
	alive "$H1" && alive "$H2" || fail "a helper was not restored"
	[ "$(inert_map "$H1" "$MAP1")" = "$MAP1" ] || fail "helper 1's mapping: '$(grep "^${MAP1%% *} " /proc/"$H1"/maps)', was '$MAP1' of $NODE"
	[ "$(inert_map "$H2" "$MAP2")" = "$MAP2" ] || fail "helper 2's mapping: '$(grep "^${MAP2%% *} " /proc/"$H2"/maps)', was '$MAP2' of $NODE"
	[ -z "$(node_map "$H1" "$NODE")" ] || fail "helper 1 maps $NODE again"
	for fd in $FD1; do
		[ "$(readlink /proc/"$H1"/fd/"$fd")" = /dev/null ] || fail "helper 1's descriptor $fd: $(readlink /proc/"$H1"/fd/"$fd"), not /dev/null"
	done
	[ "$(cuda_answers "$H1" 1)" = "$A1" ] || fail "helper 1's CUDA after restore $c: '$(tail -n 1 "$T/w/forked1.cuda")'"
	[ "$(cuda_answers "$H2" 2)" = "$A2" ] || fail "helper 2's CUDA after restore $c: '$(tail -n 1 "$T/w/forked2.cuda")'"
	grep -q " $NODE\$" /proc/"$R0"/maps || fail "rank 0 does not map $NODE after its native restore"
	cmd 3 verify $((c - 1))
	[ "$(answers 3)" = "$before" ] || fail "addresses changed: $(answers 3) (was $before)"
	cmd 3 write 1 $c
	cmd 3 verify $c
done

note "a helper that maps another device is refused before anything changes"
kill -USR2 "$H1"
wait_file "$T/w/forked1.other"
[ "$(cat "$T/w/forked1.other")" = mapped ] || fail "helper 1 could not map $E2E_OTHER_DEVICE"
criu_dump "$T/dr" && fail "criu dumped a helper that maps $E2E_OTHER_DEVICE"
has_line "$T/dr/dump.log" "dump refused: pid $H1 \(e2e_proc\) maps 1 region\(s\) of a device that is not the driver's \($E2E_OTHER_DEVICE at [0-9a-f]+\): criu cannot dump such a mapping" \
	"no refusal naming the helper and the device"
grep -q "SAVE:" "$T/dr/dump.log" && fail "the refused dump went on to SAVE"
alive "$H1" && alive "$H2" || fail "a helper died in the refused dump"
cmd 3 verify 2
[ "$(answers 3)" = "$before" ] || fail "addresses changed: $(answers 3) (was $before)"
cmd 3 exit
note done
