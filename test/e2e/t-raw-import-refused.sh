# An importer holding a raw (non-ticket) import refuses the dump before
# anything changes; the job keeps running untouched.
. "$srcdir/lib.sh"

start_job 2 --raw
cmd 2 verify 0
note dump
criu_dump "$T/d" && fail "criu dump succeeded with a live raw import"
grep -q "raw (non-ticket) imported" "$T/d/dump.log" || fail "refusal does not name the raw import"
grep -q "QUIESCE" "$T/d/dump.log" && fail "the job was quiesced before the refusal"
for p in $(job_pids); do alive $p || fail "pid $p died"; done
cmd 2 write 1 3
cmd 2 verify 3
cmd 2 exit
note done
