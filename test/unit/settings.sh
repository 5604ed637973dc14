#!/bin/sh
# settings.sh - the table of settings (protocol/settings.c) is the product's:
# FAILS, printing each offender, when
#   - product code reads a CUINTERPOSE_* name the table lacks: a whole
#     literal "CUINTERPOSE_..." in a .c or .h file under interposer/,
#     plugin/, carrier/, protocol/ or cli/ (tracked files in a git checkout,
#     else every file there; the tests/ folders, the table itself and
#     cli/cli_options.c left out). Every reader names its variable as a
#     whole literal, to getenv() or to a helper (env_uint, env_bool,
#     env_str, env_num, env_choice); a getenv() of a computed name that
#     mentions CUINTERPOSE fails too, as this check cannot see it;
#   - the table lists a name that no product code names so;
#   - docs/configuration.md does not document a user setting of the table
#     (as `NAME`), a test hook is not named CUINTERPOSE_TEST_*, a user
#     setting is, or there are more than 20 user settings;
#   - `cuinterpose options --all` (the built command) leaves out a name of
#     the table, `cuinterpose options` shows a test hook or leaves out a
#     user setting, or `--check` does not refuse a bad value naming it and
#     what it accepts (exit 1), or refuses a good one.
# Run by `make check` in test/unit with top_srcdir and top_builddir set; by
# hand: top_srcdir=.. top_builddir=. sh ../test/unit/settings.sh (in a build dir).
set -u
: "${top_srcdir:?run through make check}"
: "${top_builddir:?run through make check}"
cli=$top_builddir/cli/cuinterpose
table=protocol/settings.c
docs=docs/configuration.md
cd "$top_srcdir" || exit 1
bad=0
no() { echo "FAIL: $*"; bad=1; }
# Run without the caller's CUINTERPOSE_* variables.
clean() {
	# shellcheck disable=SC2046
	env $(env | sed -n 's/^\(CUINTERPOSE_[A-Z0-9_]*\)=.*/-u \1/p') "$@"
}

if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && [ -n "$(git ls-files "$table")" ]; then
	files=$(git ls-files -- 'interposer/*.[ch]' 'plugin/*.[ch]' 'carrier/*.[ch]' 'protocol/*.[ch]' 'cli/*.[ch]')
else
	files=$(find interposer plugin carrier protocol cli -name '*.[ch]' | sort)
fi
files=$(echo "$files" | grep -v -e '/tests/' -e "^$table\$" -e '^protocol/settings\.h$' -e '^cli/cli_options\.c$' \
	-e '\.pb-c\.[ch]$')
[ -f "$table" ] || { echo "FAIL: no $table"; exit 1; }

# shellcheck disable=SC2086
read_names=$(grep -ohE '"CUINTERPOSE_[A-Z0-9_]+"' $files | tr -d '"' | sort -u)
table_names=$(grep -oE '^[[:space:]]*ROW\("CUINTERPOSE_[A-Z0-9_]+"' "$table" | grep -oE 'CUINTERPOSE_[A-Z0-9_]+' | sort)
[ -n "$read_names" ] || no "found no CUINTERPOSE_ name in the product's sources"
[ -n "$table_names" ] || no "found no row in $table"
dups=$(echo "$table_names" | uniq -d)
[ -z "$dups" ] || no "$table lists twice:" $dups
table_names=$(echo "$table_names" | uniq)

for v in $read_names; do
	echo "$table_names" | grep -qx "$v" || {
		where=$(grep -lF "\"$v\"" $files | tr '\n' ' ')
		no "$v is read by ${where% } but $table has no row for it"
	}
done
for v in $table_names; do
	echo "$read_names" | grep -qx "$v" || no "$table lists $v, which no product code reads"
done
# shellcheck disable=SC2086
if grep -nE 'getenv\([^")]*CUINTERPOSE' $files; then
	no "a CUINTERPOSE variable is read through a computed name (above); this check cannot see it"
fi

# A row spans lines from ROW( to its closing "),"; a user row says USER.
user_names=$(awk '/^[[:space:]]*ROW\("CUINTERPOSE_/ { row = ""; on = 1 }
	on { row = row $0 }
	on && /\),[[:space:]]*$/ { on = 0; if (row ~ /,[[:space:]]*USER,/) { match(row, /CUINTERPOSE_[A-Z0-9_]+/); print substr(row, RSTART, RLENGTH) } }' "$table")
hook_names=$(echo "$table_names" | grep -vxF "$user_names")
[ -n "$user_names" ] || no "found no user setting in $table"
for v in $user_names; do
	grep -qF "\`$v\`" "$docs" || no "$v is a user setting of $table but $docs does not document it"
	case $v in CUINTERPOSE_TEST_*) no "$v is a user setting of $table but named as a test hook" ;; esac
done
for v in $hook_names; do
	case $v in CUINTERPOSE_TEST_*) ;; *) no "$v is a test hook of $table but not named CUINTERPOSE_TEST_*" ;; esac
done
n=$(echo "$user_names" | grep -c .)
[ "$n" -le 20 ] || no "$table has $n user settings, more than 20: make a knob only tests need a CUINTERPOSE_TEST_ hook"

# The command prints the table.
if [ ! -x "$cli" ]; then
	no "$cli is not built"
else
	all=$(clean "$cli" options --all) || no "cuinterpose options --all failed"
	user=$(clean "$cli" options) || no "cuinterpose options failed"
	for v in $table_names; do
		echo "$all" | grep -q "^$v[ =]" || no "cuinterpose options --all does not show $v"
	done
	for v in $user_names; do
		echo "$user" | grep -q "^$v[ =]" || no "cuinterpose options does not show the user setting $v"
	done
	for v in $hook_names; do
		echo "$user" | grep -q "^$v[ =]" && no "cuinterpose options shows the test hook $v without --all"
	done
	echo "$user" | grep -q '^CUINTERPOSE_LOG (unset)' || no "cuinterpose options does not say (unset): $user"
	out=$(clean CUINTERPOSE_LOG=2 "$cli" options) || no "cuinterpose options failed"
	echo "$out" | grep -q '^CUINTERPOSE_LOG=2 ' || no "cuinterpose options does not show CUINTERPOSE_LOG=2"

	# --check: one bad value of each kind, each named with what it accepts.
	out=$(clean CUINTERPOSE_LOG=debug CUINTERPOSE_CARRIER_HASH=sha1 CUINTERPOSE_VERIFY_BEFORE_RESTORE=maybe \
		CUINTERPOSE_TEST_CHUNK_SIZE=12 CUINTERPOSE_GPU_REMAP=0011=22 CUINTERPOSE_TEST_FAULT=zap@SAVE \
		CUINTERPOSE_CARRIER_COMPRESS=zstd:99 "$cli" options --check 2>&1)
	rc=$?
	[ $rc = 1 ] || no "options --check with bad values exited $rc, not 1: $out"
	for want in 'CUINTERPOSE_LOG=debug: want level, 0 .. 3' 'CUINTERPOSE_CARRIER_HASH=sha1: want device|sha256|off' \
		'CUINTERPOSE_VERIFY_BEFORE_RESTORE=maybe: want 1|yes|true|on or 0|no|false|off' \
		'CUINTERPOSE_TEST_CHUNK_SIZE=12: want bytes, 4096 .. 1073741824' 'CUINTERPOSE_GPU_REMAP=0011=22: want ' \
		'CUINTERPOSE_TEST_FAULT=zap@SAVE: want ' 'CUINTERPOSE_CARRIER_COMPRESS=zstd:99: want ' '7 bad values'; do
		echo "$out" | grep -qF "$want" || no "options --check did not say '$want': $out"
	done
	out=$(clean CUINTERPOSE_LOG=3 CUINTERPOSE_CARRIER_HASH=device CUINTERPOSE_VERIFY_BEFORE_RESTORE=yes \
		CUINTERPOSE_LOCK_TIMEOUT_MS=0x10 CUINTERPOSE_PREFETCH_MB=auto CUINTERPOSE_RELEASE=python:x=1 \
		CUINTERPOSE_GPU_REMAP=GPU-00112233-4455-6677-8899-aabbccddeeff=ffeeddccbbaa99887766554433221100 \
		CUINTERPOSE_TEST_FAULT=kill-agent@SAVE CUINTERPOSE_CARRIER_COMPRESS=zstd:-7 CUINTERPOSE_TEST_LOG= \
		CUINTERPOSE_NOT_A_SETTING=1 "$cli" options --check 2>&1)
	rc=$?
	[ $rc = 0 ] || no "options --check with good values exited $rc: $out"
	echo "$out" | grep -q 'note: CUINTERPOSE_NOT_A_SETTING is set but no part of cuinterpose reads it' ||
		no "options --check did not note an unknown variable: $out"
	"$cli" options --bogus >/dev/null 2>&1
	rc=$?
	[ $rc = 2 ] || no "options --bogus exited $rc, not 2"

	# checkpoint and restore refuse a bad value of the plugin's or their
	# own before they start criu or touch a process (exit 1), naming it.
	d=$(mktemp -d) || exit 1
	out=$(clean CUINTERPOSE_DRIVER_TIMEOUT_MS=5s "$cli" checkpoint $$ "$d/ck" 2>&1)
	rc=$?
	[ $rc = 1 ] || no "checkpoint with a bad value exited $rc, not 1: $out"
	echo "$out" | grep -qx 'cuinterpose checkpoint: CUINTERPOSE_DRIVER_TIMEOUT_MS=5s: want ms, 0 .. 2147483647' ||
		no "checkpoint did not name the bad value: $out"
	[ ! -e "$d/ck" ] || no "checkpoint with a bad value made $d/ck"
	out=$(clean CUINTERPOSE_PROGRESS_MS=fast "$cli" restore "$d" 2>&1)
	rc=$?
	[ $rc = 1 ] || no "restore with a bad value exited $rc, not 1: $out"
	echo "$out" | grep -qx 'cuinterpose restore: CUINTERPOSE_PROGRESS_MS=fast: want ms, 0 .. 3600000' ||
		no "restore did not name the bad value: $out"
	rm -rf "$d"
fi

[ $bad = 0 ] && echo "PASS: $(echo "$table_names" | wc -l) settings in $table ($(echo "$user_names" | wc -l) user," \
	"$(echo "$hook_names" | grep -c .) test hooks), each read by the product, each user setting in $docs," \
	"each shown by cuinterpose options"
exit $bad
