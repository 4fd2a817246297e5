/* test_metrics: the JSON-lines metrics writer and tail reader.
 *   1. 4 forked processes append ~3 KB lines concurrently to one file while the parent
 *      tails it: every line arrives whole, in per-writer order, nothing is bad.
 *   2. A writer SIGKILLed mid-stream leaves only whole lines.
 *   3. Torn / garbage / over-long lines written by hand: a torn last line is not returned
 *      until completed; bad lines are skipped and counted; a rewritten file restarts.
 *   4. Escaping (quotes, backslashes, control chars, UTF-8, invalid UTF-8), NaN/inf as
 *      null, exact integers and doubles, the common fields.
 *   5. The truncation rule: fields that do not fit are dropped whole, "dropped":N, the
 *      line stays valid JSON within METRICS_LINE_MAX. Name validation, file mode 0600.
 */
#include "io/metrics.h"
#include "util.h"
#include "test_helpers.h"

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NWRITERS 4
#define NLINES 1500

static char dir[64];

static int64_t jint(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    T_ASSERT(v && json_is_integer(v));
    return (int64_t)json_integer_value(v);
}

static const char *jstr(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    T_ASSERT(v && json_is_string(v));
    return json_string_value(v);
}

static void append_raw(const char *path, const char *s, size_t n)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    T_ASSERT(fd >= 0);
    T_ASSERT_RC(df_write_all(fd, s, n));
    close(fd);
}

/* Line `seq` of writer c: a pad of c's letter whose length varies 100..3099 bytes. */
static size_t pad_len(int c, int seq)
{
    return 100 + (size_t)((df_hash64((uint64_t)c * 1000003u + (uint64_t)seq)) % 3000);
}

static void writer_child(int c, int nlines)
{
    metrics_writer w;
    if (metrics_open(&w, dir, "shared", (uint32_t)c) < 0)
        _exit(10);
    char pad[3200];
    for (int seq = 0; nlines < 0 || seq < nlines; seq++) {
        size_t n = pad_len(c, seq);
        memset(pad, 'a' + c, n);
        pad[n] = 0;
        metrics_line l;
        metrics_begin(&l, &w, "tick");
        metrics_int(&l, "child", c);
        metrics_int(&l, "seq", seq);
        metrics_str(&l, "pad", pad);
        if (l.dropped || metrics_end(&l) < 0)
            _exit(11);
    }
    metrics_close(&w);
    _exit(0);
}

/* Check one "tick" line against what writer `child` must have written; track order. */
static void check_tick(json_t *o, int *next_seq, const pid_t *pids)
{
    int c = (int)jint(o, "child");
    T_ASSERT(c >= 0 && c < NWRITERS);
    int seq = (int)jint(o, "seq");
    T_ASSERT(seq == next_seq[c]); /* whole lines, in order per writer */
    next_seq[c]++;
    T_ASSERT(jint(o, "inc") == c);
    if (pids)
        T_ASSERT(jint(o, "pid") == pids[c]);
    T_ASSERT_STREQ(jstr(o, "worker"), "shared");
    T_ASSERT_STREQ(jstr(o, "ev"), "tick");
    const char *pad = jstr(o, "pad");
    T_ASSERT(strlen(pad) == pad_len(c, seq));
    for (size_t i = 0; pad[i]; i++)
        T_ASSERT(pad[i] == 'a' + c);
    json_t *t = json_object_get(o, "t");
    T_ASSERT(t && json_is_real(t) && json_real_value(t) > 1.6e9);
}

static void test_concurrent_writers(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/shared.jsonl", dir);
    pid_t pids[NWRITERS];
    for (int c = 0; c < NWRITERS; c++) {
        pids[c] = fork();
        T_ASSERT(pids[c] >= 0);
        if (pids[c] == 0)
            writer_child(c, NLINES);
    }
    /* tail while they write: the file may not exist yet */
    metrics_reader r;
    int rc;
    while ((rc = metrics_reader_open(&r, path)) == -ENOENT)
        usleep(1000);
    T_ASSERT_RC(rc);
    int next_seq[NWRITERS] = {0}, total = 0, alive = NWRITERS, polls = 0;
    while (total < NWRITERS * NLINES) {
        json_t *o;
        rc = metrics_reader_next(&r, &o);
        T_ASSERT_RC(rc);
        if (rc == 0) {
            polls++;
            if (alive == 0)
                break; /* writers done and nothing more: stop (and fail below) */
            int st;
            pid_t p = waitpid(-1, &st, WNOHANG);
            if (p > 0) {
                T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
                alive--;
            } else
                usleep(500);
            continue;
        }
        check_tick(o, next_seq, pids);
        json_decref(o);
        total++;
    }
    while (alive > 0) {
        int st;
        T_ASSERT(wait(&st) > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
        alive--;
    }
    json_t *o;
    T_ASSERT(metrics_reader_next(&r, &o) == 0);
    T_ASSERT(total == NWRITERS * NLINES && r.bad_lines == 0);
    for (int c = 0; c < NWRITERS; c++)
        T_ASSERT(next_seq[c] == NLINES);
    struct stat st;
    T_ASSERT(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    T_ASSERT(r.consumed == (uint64_t)st.st_size);
    metrics_reader_close(&r);
    T_ASSERT(unlink(path) == 0);
    printf("ok: %d writers x %d lines appended concurrently, tailed live (%d empty polls), all whole\n", NWRITERS,
           NLINES, polls);
}

static void test_killed_writer(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/shared.jsonl", dir);
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0)
        writer_child(2, -1); /* writes until killed */
    metrics_reader r;
    int rc;
    while ((rc = metrics_reader_open(&r, path)) == -ENOENT)
        usleep(1000);
    T_ASSERT_RC(rc);
    int next_seq[NWRITERS] = {0}, seen = 0;
    pid_t pids[NWRITERS] = {0, 0, pid, 0};
    json_t *o;
    while (seen < 300) {
        rc = metrics_reader_next(&r, &o);
        T_ASSERT_RC(rc);
        if (rc == 0) {
            usleep(200);
            continue;
        }
        check_tick(o, next_seq, pids);
        json_decref(o);
        seen++;
    }
    T_ASSERT(kill(pid, SIGKILL) == 0);
    int st;
    T_ASSERT(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st));
    while ((rc = metrics_reader_next(&r, &o)) == 1) {
        check_tick(o, next_seq, pids);
        json_decref(o);
        seen++;
    }
    T_ASSERT(rc == 0 && r.bad_lines == 0);
    metrics_reader_close(&r);
    T_ASSERT(unlink(path) == 0);
    printf("ok: writer SIGKILLed mid-stream after %d lines: every line whole\n", seen);
}

static void test_torn_and_bad_lines(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/torn.jsonl", dir);
    append_raw(path, "{\"a\":1}\n{\"b\":", 13);
    metrics_reader r;
    T_ASSERT_RC(metrics_reader_open(&r, path));
    json_t *o;
    T_ASSERT(metrics_reader_next(&r, &o) == 1 && jint(o, "a") == 1);
    json_decref(o);
    T_ASSERT(metrics_reader_next(&r, &o) == 0 && o == NULL); /* torn: not yet */
    T_ASSERT(metrics_reader_next(&r, &o) == 0);
    T_ASSERT(r.consumed == 8);
    append_raw(path, "2", 1);
    T_ASSERT(metrics_reader_next(&r, &o) == 0);
    append_raw(path, "}\n", 2);
    T_ASSERT(metrics_reader_next(&r, &o) == 1 && jint(o, "b") == 2); /* completed: returned */
    json_decref(o);
    T_ASSERT(r.bad_lines == 0);

    /* garbage, a non-object, blank lines, a torn line glued to the next writer's line */
    const char *junk = "garbage\n[1,2]\n\n  \r\n{\"c\":{\"d\":4}\n{\"e\":5}\n";
    append_raw(path, junk, strlen(junk));
    T_ASSERT(metrics_reader_next(&r, &o) == 1 && jint(o, "e") == 5);
    json_decref(o);
    T_ASSERT(r.bad_lines == 3);

    /* an over-long line (2 MiB, no newline yet) is dropped, the reader recovers after it */
    size_t big = 2u << 20;
    char *x = malloc(big);
    T_ASSERT(x);
    memset(x, 'x', big);
    append_raw(path, x, big);
    free(x);
    T_ASSERT(metrics_reader_next(&r, &o) == 0);
    append_raw(path, "tail\n{\"f\":6}\n", 13);
    T_ASSERT(metrics_reader_next(&r, &o) == 1 && jint(o, "f") == 6);
    json_decref(o);
    T_ASSERT(r.bad_lines == 4 && r.lines == 4);

    /* the file rewritten from scratch (shorter than what was read): start over */
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    T_ASSERT(fd >= 0);
    T_ASSERT_RC(df_write_all(fd, "{\"g\":7}\n", 8));
    close(fd);
    T_ASSERT(metrics_reader_next(&r, &o) == 1 && jint(o, "g") == 7);
    json_decref(o);
    T_ASSERT(r.truncations == 1);
    metrics_reader_close(&r);
    T_ASSERT(metrics_reader_open(&r, "/nonexistent/x.jsonl") == -ENOENT);
    T_ASSERT(unlink(path) == 0);
    printf("ok: torn last line held back until complete; garbage/non-object/over-long skipped and "
           "counted; rewrite restarts\n");
}

/* Read the single line of dir/<worker>.jsonl raw and parsed. */
static json_t *read_only_line(const char *worker, char *raw, size_t cap)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s.jsonl", dir, worker);
    char *text;
    size_t len;
    T_ASSERT_RC(df_read_file(path, &text, &len));
    T_ASSERT(len > 0 && len < cap && text[len - 1] == '\n');
    T_ASSERT(memchr(text, '\n', len) == text + len - 1); /* exactly one line */
    memcpy(raw, text, len + 1);
    free(text);
    json_error_t err;
    json_t *o = json_loads(raw, 0, &err);
    if (!o)
        fprintf(stderr, "line does not parse: %s at %d: %s\n", err.text, err.position, raw);
    T_ASSERT(o && json_is_object(o));
    return o;
}

static void test_escaping_and_numbers(void)
{
    metrics_writer w;
    T_ASSERT_RC(metrics_open(&w, dir, "esc", 7));
    metrics_line l;
    metrics_begin(&l, &w, "ev \"quoted\"");
    const char *s = "q\"b\\c\x01\x1f\n\t\r\b\f / caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82 \x7f";
    metrics_str(&l, "s", s);
    metrics_str(&l, "bad", "a\xff b\xc3 c\xed\xa0\x80 d\xf4\x90\x80\x80 e\xe2\x82");
    metrics_str(&l, "k\"ey\\", "v");
    metrics_str(&l, "null_str", NULL);
    metrics_num(&l, "nan", NAN);
    metrics_num(&l, "inf", INFINITY);
    metrics_num(&l, "ninf", -INFINITY);
    metrics_num(&l, "tenth", 0.1);
    metrics_num(&l, "big", 1e300);
    metrics_num(&l, "third", 1.0 / 3.0);
    metrics_num(&l, "denorm", 5e-324);
    metrics_num(&l, "neg", -3.5);
    metrics_num(&l, "whole", 42.0);
    metrics_int(&l, "imin", INT64_MIN);
    metrics_int(&l, "imax", INT64_MAX);
    metrics_u64(&l, "u", 1234567890123ull);
    metrics_bool(&l, "yes", 1);
    const double arr[4] = {0.25, 1.0 / 3.0, NAN, 7.0};
    metrics_nums(&l, "arr", arr, 4);
    metrics_nums(&l, "empty", arr, 0);
    T_ASSERT(l.dropped == 0);
    T_ASSERT_RC(metrics_end(&l));
    T_ASSERT(w.lines_written == 1);
    metrics_close(&w);

    char raw[METRICS_LINE_MAX + 1];
    json_t *o = read_only_line("esc", raw, sizeof raw);
    printf("escaped line: %s", raw);
    T_ASSERT(strstr(raw, "\\u0001\\u001f\\n\\t\\r\\b\\f"));
    T_ASSERT_STREQ(jstr(o, "s"), s);
    T_ASSERT_STREQ(jstr(o, "bad"), "a\xef\xbf\xbd b\xef\xbf\xbd c\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                                   " d\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                                   " e\xef\xbf\xbd\xef\xbf\xbd");
    T_ASSERT_STREQ(jstr(o, "k\"ey\\"), "v");
    T_ASSERT_STREQ(jstr(o, "ev"), "ev \"quoted\"");
    T_ASSERT_STREQ(jstr(o, "worker"), "esc");
    T_ASSERT(jint(o, "inc") == 7 && jint(o, "pid") == getpid());
    T_ASSERT(json_is_null(json_object_get(o, "null_str")));
    T_ASSERT(json_is_null(json_object_get(o, "nan")));
    T_ASSERT(json_is_null(json_object_get(o, "inf")));
    T_ASSERT(json_is_null(json_object_get(o, "ninf")));
    T_ASSERT(json_number_value(json_object_get(o, "tenth")) == 0.1);
    T_ASSERT(json_number_value(json_object_get(o, "big")) == 1e300);
    T_ASSERT(json_number_value(json_object_get(o, "third")) == 1.0 / 3.0);
    T_ASSERT(json_number_value(json_object_get(o, "denorm")) == 5e-324);
    T_ASSERT(json_number_value(json_object_get(o, "neg")) == -3.5);
    T_ASSERT(json_is_real(json_object_get(o, "whole")) && json_real_value(json_object_get(o, "whole")) == 42.0);
    T_ASSERT(strstr(raw, "\"tenth\":0.1,")); /* shortest exact form, not 0.10000000000000001 */
    T_ASSERT(jint(o, "imin") == INT64_MIN && jint(o, "imax") == INT64_MAX);
    T_ASSERT(jint(o, "u") == 1234567890123ll);
    T_ASSERT(json_is_true(json_object_get(o, "yes")));
    const json_t *ja = json_object_get(o, "arr");
    T_ASSERT(json_is_array(ja) && json_array_size(ja) == 4);
    T_ASSERT(json_number_value(json_array_get(ja, 0)) == 0.25);
    T_ASSERT(json_number_value(json_array_get(ja, 1)) == 1.0 / 3.0);
    T_ASSERT(json_is_null(json_array_get(ja, 2)));
    T_ASSERT(json_is_real(json_array_get(ja, 3)) && json_real_value(json_array_get(ja, 3)) == 7.0);
    T_ASSERT(json_is_array(json_object_get(o, "empty")) && json_array_size(json_object_get(o, "empty")) == 0);
    double t = json_real_value(json_object_get(o, "t"));
    T_ASSERT(fabs(t - df_wall_s()) < 3600); /* it is wall time, not monotonic */
    /* the common fields come first, in order */
    T_ASSERT(strncmp(raw, "{\"t\":", 5) == 0);
    const char *pw = strstr(raw, "\"worker\""), *pi = strstr(raw, "\"inc\""), *pp = strstr(raw, "\"pid\""),
               *pe = strstr(raw, "\"ev\"");
    T_ASSERT(pw && pi && pp && pe && pw < pi && pi < pp && pp < pe && pe < strstr(raw, "\"s\""));
    json_decref(o);

    char out[8];
    T_ASSERT(metrics_escape(out, sizeof out, "abcdef") == 8 && memcmp(out, "\"abcdef\"", 8) == 0);
    T_ASSERT(metrics_escape(out, sizeof out, "abcdefg") == -1);
    printf("ok: escaping, invalid UTF-8 -> U+FFFD, NaN/inf -> null, exact numbers, common fields\n");
}

static void test_truncation_rule(void)
{
    metrics_writer w;
    T_ASSERT_RC(metrics_open(&w, dir, "trunc", 0));
    metrics_line l;
    metrics_begin(&l, &w, "big");
    char *huge = malloc(10000);
    T_ASSERT(huge);
    memset(huge, '"', 9999); /* escapes to twice its size */
    huge[9999] = 0;
    metrics_int(&l, "before", 1);
    metrics_str(&l, "huge", huge);
    double many[300]; /* an array too long for any line: dropped whole as well */
    for (int i = 0; i < 300; i++)
        many[i] = 1.0 / (i + 3);
    metrics_nums(&l, "many", many, 300);
    metrics_int(&l, "after", 2); /* a smaller field after a dropped one still fits */
    char key[16], val[128];
    memset(val, 'v', sizeof val - 1);
    val[sizeof val - 1] = 0;
    int added = 0;
    for (int i = 0; i < 100; i++, added++) {
        snprintf(key, sizeof key, "f%03d", i);
        metrics_str(&l, key, val);
    }
    uint32_t dropped = l.dropped;
    T_ASSERT(dropped > 1 && dropped < 100);
    T_ASSERT_RC(metrics_end(&l));
    metrics_close(&w);
    char raw[METRICS_LINE_MAX + 1];
    json_t *o = read_only_line("trunc", raw, sizeof raw);
    T_ASSERT(strlen(raw) <= METRICS_LINE_MAX);
    T_ASSERT(jint(o, "before") == 1 && jint(o, "after") == 2);
    T_ASSERT(json_object_get(o, "huge") == NULL && json_object_get(o, "many") == NULL);
    T_ASSERT(jint(o, "dropped") == dropped);
    int present = 0;
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "f%03d", i);
        json_t *v = json_object_get(o, key);
        if (v) {
            T_ASSERT(i == present); /* a prefix of the fields, each whole */
            T_ASSERT_STREQ(json_string_value(v), val);
            present++;
        }
    }
    T_ASSERT(present + (int)dropped == added + 2); /* +2: "huge", "many" */
    json_decref(o);

    /* an absurd event name still yields a valid line */
    T_ASSERT_RC(metrics_open(&w, dir, "trunc2", 0));
    metrics_begin(&l, &w, huge);
    metrics_int(&l, "x", 1);
    T_ASSERT_RC(metrics_end(&l));
    metrics_close(&w);
    o = read_only_line("trunc2", raw, sizeof raw);
    T_ASSERT_STREQ(jstr(o, "ev"), "?");
    T_ASSERT(jint(o, "x") == 1);
    json_decref(o);
    free(huge);

    /* worker names become file names: only safe ones */
    const char *badnames[] = {"",    "../x",   ".hidden",
                              "a/b", "sp ace", "0123456789012345678901234567890123456789012345678901234567890123"};
    for (size_t i = 0; i < DF_ARRAY_LEN(badnames); i++)
        T_ASSERT(metrics_open(&w, dir, badnames[i], 0) == -EINVAL);
    T_ASSERT(metrics_open(&w, "/proc/no/such/dir", "w", 0) < 0);
    printf("ok: truncation drops whole fields (%u here), line valid and <= %d bytes; names checked\n", dropped,
           METRICS_LINE_MAX);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        printf("usage: %s   (metrics JSONL writer/reader tests; no options)\n", argv[0]);
        return strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(dir, sizeof dir, "/tmp/df_test_metrics_XXXXXX");
    T_ASSERT(mkdtemp(dir));
    test_escaping_and_numbers();
    test_truncation_rule();
    test_torn_and_bad_lines();
    test_concurrent_writers();
    test_killed_writer();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    T_ASSERT(system(cmd) == 0);
    printf("test_metrics: all passed\n");
    return 0;
}
