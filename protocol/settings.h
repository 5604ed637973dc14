/*
 * settings.h - the one table of the CUINTERPOSE_* environment variables
 * that the product reads (settings.c): the job's processes (the interposer
 * and its carrier), criu's plugin and the `cuinterpose` command.
 *
 * Readers take a number or a yes/no through cuip_setting_number, which
 * parses by the row and applies its default: range and default are written
 * once, here. Strings, words and lists (paths, enums, GPU_REMAP) are read
 * where they are used, and the row states what they accept. One policy
 * for a bad value: every reader refuses it before anything changes,
 * through cuip_settings_check_env (criu's plugin at init, the command
 * before it starts criu, the job at its first cuInit), with the table's
 * "NAME=VALUE: want RANGE".
 * `cuinterpose options` prints it and checks an environment against it
 * (cli/cli_options.c); test/unit/settings.sh fails when a name the sources
 * read is missing from it, when it holds a name no source reads, or when
 * docs/configuration.md lacks one of its user settings.
 */
#ifndef CUIP_SETTINGS_H
#define CUIP_SETTINGS_H

#include <stddef.h>
#include <stdint.h>

enum cuip_setting_type {
	CUIP_SETTING_BOOL, /* 1, yes, true, on / 0, no, false, off (any case) */
	CUIP_SETTING_FLAG, /* on when set, to any value (even "0" or "") */
	CUIP_SETTING_INT,  /* a whole number min..max, counting `unit` */
	CUIP_SETTING_MIB,  /* a whole number of MiB, min..max */
	CUIP_SETTING_MS,   /* a whole number of milliseconds, min..max */
	CUIP_SETTING_ENUM, /* one of `values` */
	CUIP_SETTING_PATH, /* a file, library or directory, shorter than PATH_MAX */
	CUIP_SETTING_LIST, /* a comma-separated list of the form `values` */
};

/* Who reads a variable (a bit set). */
#define CUIP_READER_JOB	   1u /* the job's processes: the interposer and its carrier */
#define CUIP_READER_PLUGIN 2u /* criu's plugin, from criu's environment */
#define CUIP_READER_CLI	   4u /* the cuinterpose command */

enum cuip_setting_kind {
	CUIP_SETTING_USER, /* a user setting, documented in docs/configuration.md */
	CUIP_SETTING_HOOK, /* a test hook, named CUINTERPOSE_TEST_*: fault injection, test
			      logs, knobs only the tests and benchmarks set */
};

/* What the readers do with a value outside the table's range. */
enum cuip_setting_bad {
	CUIP_BAD_REFUSE, /* the reader fails naming the variable and its range, before
			    anything changes (criu's plugin at init, the command before
			    it starts criu, the job's processes at their first cuInit) */
	CUIP_BAD_NONE,	 /* every value is taken (a flag) */
};

/* Flags of a row. */
#define CUIP_SETTING_HEX 1u /* the number may also be 0x hex (or 0-led octal): strtoull base 0 */

struct cuip_setting {
	const char *name;
	enum cuip_setting_type type;
	const char *unit;   /* INT: what it counts ("bytes", "files", ...) */
	uint64_t min, max;  /* INT, MIB, MS: the accepted range; LIST: max entries */
	const char *values; /* ENUM: "a|b|c"; INT/MIB/MS: words taken too ("auto");
				 LIST: the form of one entry and the words taken */
	const char *dflt;   /* the default, as the reader applies it */
	unsigned readers;   /* CUIP_READER_* */
	enum cuip_setting_kind kind;
	enum cuip_setting_bad bad;
	unsigned flags;	     /* CUIP_SETTING_HEX */
	const char *where;   /* the reading code: file:function, ... */
	const char *meaning; /* one line */
};

extern const struct cuip_setting cuip_settings[];
extern const size_t cuip_settings_count;

/* The row of `name` (a whole CUINTERPOSE_* name), or NULL. */
const struct cuip_setting *cuip_setting_find(const char *name);

/*
 * Whether `value` (the environment's; NULL: unset) is one the table
 * accepts for s: 0, or -EINVAL with err saying
 * "NAME=VALUE: want RANGE". Unset and (except for a FLAG) empty values
 * are the default's and pass.
 */
int cuip_setting_check(const struct cuip_setting *s, const char *value, char *err, size_t errlen);

/* What cuip_setting_number found besides a number (its value >= 0). */
#define CUIP_SETTING_UNSET 1 /* unset or empty, and the default is no number: the reader's own */
#define CUIP_SETTING_WORD  2 /* one of the row's words ("auto"): the reader reads it by name */

/*
 * The value of a number (INT, MIB, MS) or yes/no (BOOL) setting in this
 * environment, by its row: the default when unset or empty (the number
 * the row's default starts with), else the value in the row's base, a
 * BOOL as 1 or 0. 0 with *out set; CUIP_SETTING_UNSET or
 * CUIP_SETTING_WORD with *out left as it was; -EINVAL for a bad value
 * (err as cuip_setting_check says; *out holds the default); -ENOENT for a
 * name that is no number or yes/no row of the table.
 */
int cuip_setting_number(const char *name, uint64_t *out, char *err, size_t errlen);

/* The accepted values of s in words ("ms, 0 .. 3600000", "async|sync"). */
void cuip_setting_range(const struct cuip_setting *s, char *buf, size_t len);

/* "bool", "integer", "MiB", "ms", "enum", "path", "list", "flag". */
const char *cuip_setting_type_name(enum cuip_setting_type t);

/* The readers in words: "job", "plugin", "cli", joined by '+'. */
void cuip_setting_readers(unsigned readers, char *buf, size_t len);

/* "refuse", "none". */
const char *cuip_setting_bad_name(enum cuip_setting_bad b);

/*
 * Every variable of the table read by one of `readers` (CUIP_READER_*)
 * checked in this environment: 0, or -EINVAL with err saying the first
 * bad one as cuip_setting_check does.
 */
int cuip_settings_check_env(unsigned readers, char *err, size_t errlen);

/*
 * A GPU UUID: blanks around, an optional GPU- prefix, 32 hex digits with
 * dashes anywhere (the `nvidia-smi -L` form). 0 and the 16 bytes in out,
 * or -EINVAL. The one parser of CUINTERPOSE_GPU_REMAP's UUIDs: the table's
 * check and plugin/options.c's cuip_parse_remap.
 */
int cuip_parse_uuid(const char *s, size_t len, uint8_t out[16]);

#endif /* CUIP_SETTINGS_H */
