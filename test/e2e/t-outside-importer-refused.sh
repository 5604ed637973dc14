# A process outside the dumped tree imports the creator's memory, and its
# own control socket is in another directory (another
# CUINTERPOSE_SOCKET_DIR): the creator recorded it when it fetched, so the
# dump is refused before anything changes, naming the creator and the
# importer, and the job keeps running with its bytes. Once the importer has
# exited, the same dump goes through and restores.
. "$srcdir/lib.sh"
THIEF=$B/test/e2e/e2e_thief
[ -x "$THIEF" ] || skip "e2e_thief not built"
HOLDER=
cleanup_holder() {
	[ -n "$HOLDER" ] && kill -9 "$HOLDER" 2>/dev/null
}
at_exit cleanup_holder

start_job 2
creator=$JOBPID
r1=$(awk '{print $2}' "$T/w/r1.ready")
cmd 2 verify 0
before=$(answers 2)
tfd=$(ls -l /proc/"$r1"/fd | awk '/memfd:cuinterpose-ticket/ {print $9; exit}')
[ -n "$tfd" ] || fail "rank 1 (pid $r1) holds no ticket"
cat /proc/"$r1"/fd/"$tfd" >"$T/ticket"

note "outside importer"
mkdir -p "$T/othersock"
CUINTERPOSE_SOCKET_DIR=$T/othersock LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" "$THIEF" hold "$T/ticket" \
	</dev/null >"$T/holder.out" 2>"$T/holder.log" &
HOLDER=$!
i=0
while ! grep -q "^import: " "$T/holder.out" && alive $HOLDER && [ $i -lt 400 ]; do
	nap 0.05
	i=$((i + 1))
done
grep -q "^import: CUDA_SUCCESS pid $HOLDER$" "$T/holder.out" ||
	fail "the outside importer: $(cat "$T/holder.out" "$T/holder.log")"
ls "$T/othersock" | grep -q "^$HOLDER-[0-9a-f]*\.sock$" ||
	fail "the importer's socket is not in its own directory: $(ls "$T/othersock" "$T/sock")"
ls "$T/sock" | grep -q "^$HOLDER-" && fail "the importer's socket is in the job's directory"

note "dump refused"
criu_dump "$T/d1" && fail "criu dump succeeded while pid $HOLDER outside the tree imports the memory"
grep -Eq "cuinterpose: .*pid $creator allocation [0-9a-f]+:[0-9]+ is imported by pid $HOLDER \(identity [0-9a-f]{16}\), a live process outside the dumped tree" \
	"$T/d1/dump.log" || fail "the refusal does not name the creator $creator and the importer $HOLDER: $(grep cuinterpose "$T/d1/dump.log" | tail -5)"
grep -q "cuinterpose: PREFLIGHT: .*(REFUSED)" "$T/d1/dump.log" || fail "not refused at PREFLIGHT"
for p in $(job_pids); do alive $p || fail "pid $p died"; done
alive $HOLDER || fail "the outside importer died"
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "addresses changed after the refusal: $(answers 2) vs $before"
cmd 2 write 1 1
cmd 2 verify 1

note "the importer exits: the dump goes through"
kill $HOLDER
wait $HOLDER 2>/dev/null
HOLDER=
pids=$(job_pids)
criu_dump "$T/d2" || fail "criu dump after the outside importer exited: $(grep cuinterpose "$T/d2/dump.log" | tail -5)"
wait_gone $pids || fail "dumped processes still alive"
criu_restore "$T/d2" || fail "criu restore"
cmd 2 verify 1
[ "$(answers 2)" = "$before" ] || fail "addresses changed: $(answers 2) vs $before"
cmd 2 write 0 2
cmd 2 verify 2
cmd 2 exit
note done
