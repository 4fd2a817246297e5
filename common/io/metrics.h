/* metrics.h: per-process JSON-lines metrics, written by workers, tailed by the orchestrator.
 *
 * Each worker appends to <run>/metrics/<worker>.jsonl. One line = one JSON object =
 * exactly ONE write() of the whole line including its '\n' on an O_APPEND fd, so lines from
 * several processes (a worker and its restarted incarnation, or forked writers) never
 * interleave, and a SIGKILL can at worst leave a torn last line without '\n', which the
 * reader does not return until it is complete (it never is: the next writer's line glues on,
 * forming one unparsable line that the reader skips and counts).
 *
 * Every line starts with the same fields, then the event's figures:
 *   {"t":1767225600.123456,"worker":"target0","inc":3,"pid":4242,"ev":"step", ...}
 *   t: wall-clock seconds (CLOCK_REALTIME) when metrics_begin was called; inc: the worker's
 *   incarnation (restart count); pid: the writing process; ev: the event name.
 * Numbers: metrics_int is exact (int64); metrics_num uses the shortest of %.15g/%.17g that
 * reads back bit-identical, always with a '.' or exponent (42.0, so typed readers see a
 * real); NaN and +-inf are written as null (JSON has no such numbers).
 * Strings: '"' '\\' and control characters are escaped, valid UTF-8 is kept as is, every
 * byte of an invalid UTF-8 sequence becomes U+FFFD, so the line is always valid JSON.
 *
 * Truncation rule: a line holds at most METRICS_LINE_MAX bytes. A field (key + value)
 * that does not fit whole is dropped whole, later smaller fields may still fit; when any
 * field was dropped the line ends with "dropped":<count>. Room for that and for "}\n" is
 * reserved from the start, so the emitted line is always complete, valid JSON.
 *
 * Usage (worker):
 *   metrics_writer w; metrics_open(&w, "run/metrics", "target0", inc);
 *   metrics_line l; metrics_begin(&l, &w, "step");
 *   metrics_int(&l, "batch", id); metrics_num(&l, "tok_s", tps); metrics_end(&l);
 * A writer is for one thread (or lock around it); lines are built on the caller's stack.
 *
 * TensorBoard (optional, metrics_open_tfevents): every line that has an integer "step"
 * field (metrics_int) also becomes one TensorBoard Event at that step, after its JSONL line
 * is written, with wall_time = the line's "t" and one scalar per metrics_num / metrics_int
 * field other than "step", tagged "<ev>/<key>" ("train/<key>" for the "step" event: the
 * drafter's training step). metrics_u64, metrics_bool and metrics_str fields (ids, flags,
 * names) and fields the truncation rule dropped are not in it; null (NaN, inf) is kept as
 * the float NaN/inf. A line without "step" (the stage figures) has no event. A failed event
 * write is counted in the tfevents writer and never fails the line (io/tfevents.h).
 */
#ifndef DF_METRICS_H
#define DF_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define METRICS_LINE_MAX 4096
#define METRICS_NAME_MAX 64
#define METRICS_SCALARS_MAX 128 /* numeric fields of one line that reach the TensorBoard event (more: left out of it) */

struct tfevents_writer;

typedef struct metrics_writer {
    int fd; /* O_APPEND, close-on-exec; -1 when closed */
    uint32_t incarnation;
    char worker[METRICS_NAME_MAX]; /* validated: [A-Za-z0-9_.-], not starting with '.' */
    uint64_t lines_written, write_errors;
    struct tfevents_writer *tb; /* NULL, or the event file every line with a step also goes to */
} metrics_writer;

typedef struct metrics_line {
    metrics_writer *w;
    size_t len;       /* bytes used in buf */
    uint32_t dropped; /* fields dropped by the truncation rule */
    char buf[METRICS_LINE_MAX];
    /* for the TensorBoard event (only kept while w->tb is set) */
    double t;                /* the line's "t" */
    uint16_t ev_off, ev_len; /* the event name as written in buf (between its quotes) */
    int has_step;            /* an integer "step" field was added */
    int64_t step;
    uint32_t n_scalars;
    struct {
        uint16_t key_off, key_len; /* the key as written in buf (between its quotes) */
        uint16_t elem;             /* 0: the field itself; i > 0: element i of an array field (tag key_i) */
        double v;
    } scalars[METRICS_SCALARS_MAX];
} metrics_line;

/* Open (create 0600, append) <dir>/<worker>.jsonl; dir is created (0700) if missing.
 * worker: 1..63 chars of [A-Za-z0-9_.-], not starting with '.' (-EINVAL otherwise).
 * 0 or -errno. */
int metrics_open(metrics_writer *w, const char *dir, const char *worker, uint32_t incarnation);
/* Also write the lines with a step as TensorBoard events: a new event file in dir (created,
 * with parents), owned by w from now on. session_start: see io/tfevents.h (a worker that
 * resumes from a checkpoint, so TensorBoard drops the steps it redoes). 0 or -errno (err
 * says what failed; the JSONL lines go on without events then). */
int metrics_open_tfevents(metrics_writer *w, const char *dir, int session_start, char *err, size_t errcap);
void metrics_close(metrics_writer *w); /* closes the event file too */

/* Start a line for event `ev` with the common fields (t, worker, inc, pid, ev). */
void metrics_begin(metrics_line *l, metrics_writer *w, const char *ev);
void metrics_num(metrics_line *l, const char *key, double v); /* NaN/inf -> null */
/* An array of n numbers, each written as metrics_num writes one (dropped whole if it does
 * not fit, as any field) */
void metrics_nums(metrics_line *l, const char *key, const double *v, int n);
void metrics_int(metrics_line *l, const char *key, int64_t v);
void metrics_u64(metrics_line *l, const char *key, uint64_t v);
void metrics_bool(metrics_line *l, const char *key, int v);
void metrics_str(metrics_line *l, const char *key, const char *v); /* NULL -> null */
/* Close the object and emit it with one write(). 0 or -errno. A short write (disk full)
 * is followed by a lone '\n' so the partial line ends as one skipped bad line instead of
 * swallowing the next writer's line; returns -ENOSPC then. */
int metrics_end(metrics_line *l);

/* Escape s as a JSON string (with quotes) into out[cap]; returns the length, or -1 if it
 * does not fit (out then unspecified). Exposed for tests and other JSON-lines writers. */
long metrics_escape(char *out, size_t cap, const char *s);

/* Reader: tails a JSONL file, returning complete lines only. */
typedef struct metrics_reader {
    int fd;
    uint64_t offset;   /* file offset of the first byte not yet read into buf */
    uint64_t consumed; /* file offset just past the last complete line returned/skipped */
    char *buf;         /* [cap]; bytes [start, len) read but not yet returned */
    size_t start, len, cap;
    int skipping;         /* inside an over-long line: drop bytes until its '\n' */
    uint64_t lines;       /* objects returned */
    uint64_t bad_lines;   /* complete lines that were not a JSON object (skipped) */
    uint64_t truncations; /* times the file shrank (rewritten): re-read from 0 */
} metrics_reader;

#define METRICS_READER_MAX_LINE (1u << 20)

/* Open path for reading from offset 0. -ENOENT if it does not exist yet (retry later). */
int metrics_reader_open(metrics_reader *r, const char *path);
/* Next complete line parsed as a JSON object: returns 1 and *obj (a new reference: the
 * caller json_decref's it), 0 when no complete line is available yet (call again when
 * the file has grown), or -errno. Unparsable or non-object lines are skipped and counted
 * in r->bad_lines; blank lines are skipped silently. */
int metrics_reader_next(metrics_reader *r, json_t **obj);
void metrics_reader_close(metrics_reader *r);

#endif
