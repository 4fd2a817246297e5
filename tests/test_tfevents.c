/* test_tfevents: the TensorBoard event file writer (common/io/tfevents.h) and the metrics
 * hook that feeds it (metrics_open_tfevents).
 *   1. CRC32C known answers ("123456789" -> 0xe3069283 and the iSCSI vectors of RFC 3720:
 *      32 zero bytes, 32 0xff bytes, 0..31 and 31..0), a CRC continued over two pieces ==
 *      the whole, the mask of TFRecord; varints of 0, 1, 127, 128, 300 and 2^64-1.
 *   2. The bytes of a file: the file_version record, a SessionLog START, then an Event with
 *      three values (one past the float range: +inf) at step 300, each record's framing and
 *      every byte of its data compared with bytes worked out by hand from the schema.
 *   3. The metrics hook: a "step" line becomes one Event at its step, wall_time = its "t",
 *      tags train/<key> for its metrics_num / metrics_int fields (not its u64, str, bool
 *      fields), hand-computed bytes again; a line without a step and a line with a step but
 *      no number write nothing; a "checkpoint" line's tags are checkpoint/<key>.
 *   4. A writer SIGKILLed while writing 2 KB records as fast as it can: every record of its
 *      file is whole and in sequence, at most a torn tail; a new writer in that directory
 *      gets a new file (the old one untouched).
 *   5. A write cut short by the file size limit (RLIMIT_FSIZE): the partial record is cut
 *      off again, the file holds whole records only, and a later record that fits follows
 *      them whole (without the cut it would follow the torn bytes: unreadable).
 *   6. A summary that runs out of room drops values whole and counts them; empty tags are
 *      refused.
 * The Python side (tests/check_tfevents.py) reads real runs' files with the protobuf
 * runtime (tests/test_pipeline.sh, tests/test_validator.sh). */
#include "io/metrics.h"
#include "io/tfevents.h"
#include "util.h"
#include "test_helpers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char root[64];

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* The TFRecord mask, written out here again from its definition. */
static uint32_t mask(uint32_t c)
{
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

typedef struct rec {
    const uint8_t *data;
    size_t len;
} rec;

/* Split buf[n] into records, checking both CRCs of each; returns the count, *tail = bytes
 * after the last whole record. */
static int split(const uint8_t *buf, size_t n, rec *out, int max, size_t *tail)
{
    size_t off = 0;
    int k = 0;
    while (n - off >= 12) {
        uint64_t len = le64(buf + off);
        T_ASSERT(le32(buf + off + 8) == mask(tfevents_crc32c(0, buf + off, 8)));
        if (n - off < 12 + len + 4)
            break;
        T_ASSERT(le32(buf + off + 12 + len) == mask(tfevents_crc32c(0, buf + off + 12, len)));
        T_ASSERT(k < max);
        out[k].data = buf + off + 12;
        out[k].len = len;
        k++;
        off += 16 + len;
    }
    *tail = n - off;
    return k;
}

/* The one file in dir (there must be exactly `want` files; returns the newest name). */
static void only_file(const char *dir, int want, char *path, size_t cap)
{
    DIR *d = opendir(dir);
    T_ASSERT(d);
    struct dirent *e;
    int n = 0;
    char best[256] = "";
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        T_ASSERT(strncmp(e->d_name, "events.out.tfevents.", 20) == 0);
        n++;
        if (strcmp(e->d_name, best) > 0)
            snprintf(best, sizeof best, "%s", e->d_name);
    }
    closedir(d);
    T_ASSERT(n == want);
    snprintf(path, cap, "%s/%s", dir, best);
}

static uint8_t *slurp(const char *path, size_t *n)
{
    char *b;
    T_ASSERT_RC(df_read_file(path, &b, n));
    return (uint8_t *)b;
}

/* The file_version record: wall_time (checked to lie in [t0, t1]), no step, "brain.Event:2". */
static void check_version(const rec *r, double t0, double t1)
{
    static const uint8_t want[] = {0x1a, 13, 'b', 'r', 'a', 'i', 'n', '.', 'E', 'v', 'e', 'n', 't', ':', '2'};
    T_ASSERT(r->len == 9 + sizeof want);
    T_ASSERT(r->data[0] == 0x09);
    double wt;
    uint64_t bits = le64(r->data + 1);
    memcpy(&wt, &bits, 8);
    T_ASSERT(wt >= t0 - 1e-3 && wt <= t1 + 1e-3);
    T_ASSERT(memcmp(r->data + 9, want, sizeof want) == 0);
}

static void test_crc_varint(void)
{
    T_ASSERT(tfevents_crc32c(0, "123456789", 9) == 0xe3069283u);
    T_ASSERT(tfevents_crc32c(0, "", 0) == 0);
    uint8_t b[32];
    memset(b, 0, 32);
    T_ASSERT(tfevents_crc32c(0, b, 32) == 0x8a9136aau);
    memset(b, 0xff, 32);
    T_ASSERT(tfevents_crc32c(0, b, 32) == 0x62a8ab43u);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)i;
    T_ASSERT(tfevents_crc32c(0, b, 32) == 0x46dd794eu);
    uint32_t part = tfevents_crc32c(0, b, 13);
    T_ASSERT(tfevents_crc32c(part, b + 13, 19) == 0x46dd794eu);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)(31 - i);
    T_ASSERT(tfevents_crc32c(0, b, 32) == 0x113fdb5cu);
    /* mask(0xe3069283): rotate right by 15 = 0x2507c60d, + 0xa282ead8, worked by hand */
    T_ASSERT(tfevents_masked_crc("123456789", 9) == 0xc78ab0e5u);

    uint8_t v[10];
    T_ASSERT(tfevents_varint(v, 0) == 1 && v[0] == 0);
    T_ASSERT(tfevents_varint(v, 1) == 1 && v[0] == 1);
    T_ASSERT(tfevents_varint(v, 127) == 1 && v[0] == 0x7f);
    T_ASSERT(tfevents_varint(v, 128) == 2 && v[0] == 0x80 && v[1] == 0x01);
    T_ASSERT(tfevents_varint(v, 300) == 2 && v[0] == 0xac && v[1] == 0x02);
    T_ASSERT(tfevents_varint(v, UINT64_MAX) == 10 && v[9] == 0x01);
    for (int i = 0; i < 9; i++)
        T_ASSERT(v[i] == 0xff);
    printf("ok: crc32c known answers, mask, varints\n");
}

static void test_file_bytes(void)
{
    char dir[128], path[4200], err[512];
    snprintf(dir, sizeof dir, "%s/bytes/sub", root); /* parents are created */
    double t0 = df_wall_s();
    tfevents_writer w;
    T_ASSERT_RC(tfevents_open(&w, dir, 1, err, sizeof err));
    T_ASSERT(w.records == 1);
    tfevents_summary s;
    tfevents_summary_init(&s);
    T_ASSERT_RC(tfevents_summary_add(&s, "a/b", 3, 0.25));
    T_ASSERT_RC(tfevents_summary_add(&s, "loss", 4, -2.0));
    T_ASSERT_RC(tfevents_summary_add(&s, "in", 2, 1e39)); /* past FLT_MAX: +inf */
    T_ASSERT(s.n == 3 && s.dropped == 0);
    T_ASSERT_RC(tfevents_write(&w, 1.5, 300, &s));
    T_ASSERT(w.records == 3 && w.write_errors == 0);
    tfevents_close(&w);
    double t1 = df_wall_s();

    only_file(dir, 1, path, sizeof path);
    T_ASSERT_STREQ(path, w.path);
    struct stat st;
    T_ASSERT(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    size_t n, tail;
    uint8_t *buf = slurp(path, &n);
    T_ASSERT(n == w.size);
    rec r[8];
    T_ASSERT(split(buf, n, r, 8, &tail) == 3 && tail == 0);
    check_version(&r[0], t0, t1);
    /* wall_time 1.5 = 0x3ff8000000000000; step 300 = varint ac 02 */
#define WALL_1_5 0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f
    static const uint8_t start[] = {WALL_1_5, 0x10, 0xac, 0x02, 0x32, 0x02, 0x08, 0x01}; /* session_log{START} */
    T_ASSERT(r[1].len == sizeof start && memcmp(r[1].data, start, sizeof start) == 0);
    static const uint8_t ev[] = {
        WALL_1_5, 0x10, 0xac, 0x02, 0x2a, 36,                                      /* summary: 12 + 13 + 11 bytes */
        0x0a,     10,   0x0a, 3,    'a',  '/', 'b',  0x15, 0,    0,    0x80, 0x3e, /* 0.25f = 0x3e800000 */
        0x0a,     11,   0x0a, 4,    'l',  'o', 's',  's',  0x15, 0,    0,    0,    0xc0, /* -2.0f = 0xc0000000 */
        0x0a,     9,    0x0a, 2,    'i',  'n', 0x15, 0,    0,    0x80, 0x7f,             /* +inf = 0x7f800000 */
    };
    T_ASSERT(r[2].len == sizeof ev && memcmp(r[2].data, ev, sizeof ev) == 0);
    free(buf);

    /* a second file in the same second gets its own name; step 0 is left out, a negative
     * step is 10 bytes */
    T_ASSERT_RC(tfevents_open(&w, dir, 0, err, sizeof err));
    tfevents_summary_init(&s);
    T_ASSERT_RC(tfevents_summary_add(&s, "x", 1, 0.0));
    T_ASSERT_RC(tfevents_write(&w, 1.5, 0, &s));
    T_ASSERT_RC(tfevents_write(&w, 1.5, -1, &s));
    tfevents_close(&w);
    only_file(dir, 2, path, sizeof path);
    T_ASSERT(strcmp(path, w.path) == 0 || strlen(w.path) > strlen(path)); /* the suffixed name sorts later */
    buf = slurp(w.path, &n);
    T_ASSERT(split(buf, n, r, 8, &tail) == 3 && tail == 0); /* no START: session_start was 0 */
    static const uint8_t z[] = {WALL_1_5, 0x2a, 10, 0x0a, 8, 0x0a, 1, 'x', 0x15, 0, 0, 0, 0};
    T_ASSERT(r[1].len == sizeof z && memcmp(r[1].data, z, sizeof z) == 0);
    static const uint8_t neg[] = {WALL_1_5, 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
                                  0x2a,     10,   0x0a, 8,    0x0a, 1,    'x',  0x15, 0,    0,    0,    0};
    T_ASSERT(r[2].len == sizeof neg && memcmp(r[2].data, neg, sizeof neg) == 0);
    free(buf);
#undef WALL_1_5
    printf("ok: file_version, START and summary records == the hand-encoded bytes; a second file; steps 0 and -1\n");
}

static void test_metrics_hook(void)
{
    char mdir[128], tdir[128], path[4200], err[512];
    snprintf(mdir, sizeof mdir, "%s/hook/metrics", root);
    snprintf(tdir, sizeof tdir, "%s/hook/tensorboard/w0", root);
    metrics_writer mw;
    T_ASSERT_RC(metrics_open(&mw, mdir, "w0", 0));
    T_ASSERT_RC(metrics_open_tfevents(&mw, tdir, 0, err, sizeof err));
    T_ASSERT(metrics_open_tfevents(&mw, tdir, 0, err, sizeof err) == -EBUSY);
    metrics_line l;
    metrics_begin(&l, &mw, "step");
    metrics_int(&l, "step", 7);
    metrics_u64(&l, "batch", 9);
    metrics_num(&l, "loss", 1.25);
    metrics_str(&l, "s", "x");
    metrics_bool(&l, "b", 1);
    metrics_int(&l, "tokens", 42);
    T_ASSERT_RC(metrics_end(&l));
    double t_step = l.t;
    metrics_begin(&l, &mw, "stage"); /* no step: no event */
    metrics_num(&l, "busy_frac", 0.5);
    T_ASSERT_RC(metrics_end(&l));
    metrics_begin(&l, &mw, "final"); /* a step but no number: no event */
    metrics_int(&l, "step", 8);
    metrics_str(&l, "hash", "00ff");
    T_ASSERT_RC(metrics_end(&l));
    metrics_begin(&l, &mw, "checkpoint");
    metrics_int(&l, "step", 4);
    metrics_num(&l, "write_s", 0.125);
    T_ASSERT_RC(metrics_end(&l));
    double t_ck = l.t;
    metrics_close(&mw);
    T_ASSERT(mw.tb == NULL);

    only_file(tdir, 1, path, sizeof path);
    size_t n, tail;
    uint8_t *buf = slurp(path, &n);
    rec r[8];
    T_ASSERT(split(buf, n, r, 8, &tail) == 3 && tail == 0);
    uint8_t want_wall[9] = {0x09};
    uint64_t bits;
    memcpy(&bits, &t_step, 8); /* the line's own "t", to the bit */
    for (int i = 0; i < 8; i++)
        want_wall[1 + i] = (uint8_t)(bits >> (8 * i));
    T_ASSERT(memcmp(r[1].data, want_wall, 9) == 0);
    static const uint8_t
        ev1
            [] =
                {
                    0x10, 7,   0x2a, 40, /* step 7; summary: 19 + 21 bytes */
                    0x0a, 17,  0x0a, 10,   't', 'r',  'a',  'i',  'n',  '/',  'l',
                    'o',  's', 's',  0x15, 0,   0,    0xa0, 0x3f, /* 1.25f = 0x3fa00000 */
                    0x0a, 19,  0x0a, 12,   't', 'r',  'a',  'i',  'n',  '/',  't',
                    'o',  'k', 'e',  'n',  's', 0x15, 0,    0,    0x28, 0x42, /* 42.0f = 0x42280000 */
                };
    T_ASSERT(r[1].len == 9 + sizeof ev1 && memcmp(r[1].data + 9, ev1, sizeof ev1) == 0);
    memcpy(&bits, &t_ck, 8);
    for (int i = 0; i < 8; i++)
        want_wall[1 + i] = (uint8_t)(bits >> (8 * i));
    T_ASSERT(memcmp(r[2].data, want_wall, 9) == 0);
    static const uint8_t ev2[] = {
        0x10, 4,   0x2a, 27,  0x0a, 25,  0x0a, 18,  'c', 'h', 'e',  'c', 'k', 'p', 'o',  'i',
        'n',  't', '/',  'w', 'r',  'i', 't',  'e', '_', 's', 0x15, 0,   0,   0,   0x3e, /* 0.125f = 0x3e000000 */
    };
    T_ASSERT(r[2].len == 9 + sizeof ev2 && memcmp(r[2].data + 9, ev2, sizeof ev2) == 0);
    free(buf);
    printf("ok: metrics lines with a step -> one event each (train/<key>, checkpoint/<key>), others none\n");
}

/* A record's summary for the kill and size-limit tests: nv values whose tag names step. */
static void fill(tfevents_summary *s, int nv, int64_t step)
{
    tfevents_summary_init(s);
    for (int i = 0; i < nv; i++) {
        char tag[64];
        int k = snprintf(tag, sizeof tag, "kill/value_%03d_of_step_%08lld", i, (long long)step);
        T_ASSERT_RC(tfevents_summary_add(s, tag, (size_t)k, (double)step + i));
    }
}

/* Every whole record of path: the version, then steps 1, 2, ... each with nv values. */
static int check_sequence(const char *path, int nv, size_t *tail)
{
    size_t n;
    uint8_t *buf = slurp(path, &n);
    static rec r[200000];
    int k = split(buf, n, r, 200000, tail);
    T_ASSERT(k >= 1 && r[0].len == 9 + 15);
    for (int i = 1; i < k; i++) {
        tfevents_summary s;
        fill(&s, nv, i);
        T_ASSERT(r[i].len > 12 + s.len && memcmp(r[i].data + r[i].len - s.len, s.buf, s.len) == 0);
    }
    free(buf);
    return k;
}

static void test_kill(void)
{
    char dir[128], path[4200], err[512];
    snprintf(dir, sizeof dir, "%s/kill", root);
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        tfevents_writer w;
        if (tfevents_open(&w, dir, 0, err, sizeof err) < 0)
            _exit(10);
        for (int64_t step = 1;; step++) {
            tfevents_summary s;
            fill(&s, 48, step); /* about 2.1 KB a record: records straddle pages */
            if (tfevents_write(&w, df_wall_s(), step, &s) < 0)
                _exit(11);
        }
    }
    struct stat st;
    for (;;) { /* until the file has grown past 4 MB: the child writes all the while */
        DIR *d = opendir(dir);
        struct dirent *e = NULL;
        if (d) {
            while ((e = readdir(d)) && e->d_name[0] == '.')
                ;
            if (e) {
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                if (stat(path, &st) == 0 && st.st_size > (4 << 20)) {
                    closedir(d);
                    break;
                }
            }
            closedir(d);
        }
        int ws;
        T_ASSERT(waitpid(pid, &ws, WNOHANG) == 0); /* still writing */
        usleep(2000);
    }
    kill(pid, SIGKILL);
    int ws;
    T_ASSERT(waitpid(pid, &ws, 0) == pid && WIFSIGNALED(ws));
    size_t tail;
    int k = check_sequence(path, 48, &tail);
    T_ASSERT(k > 1000);
    T_ASSERT(stat(path, &st) == 0);
    off_t before = st.st_size;
    tfevents_writer w;
    T_ASSERT_RC(tfevents_open(&w, dir, 0, err, sizeof err)); /* the restarted writer: a new file */
    T_ASSERT(strcmp(w.path, path) != 0);
    tfevents_close(&w);
    T_ASSERT(stat(path, &st) == 0 && st.st_size == before);
    printf("ok: SIGKILLed writer: %d whole records in sequence, %zu bytes of torn tail; the next writer "
           "opened a new file\n",
           k, tail);
}

static void test_size_limit(void)
{
    char dir[128], path[4200], err[512];
    snprintf(dir, sizeof dir, "%s/limit", root);
    T_ASSERT_RC(df_mkdir_p(dir, 0700));
    fflush(stdout);
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) { /* the limit applies to the whole process: a child of its own */
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {.rlim_cur = 20000, .rlim_max = 20000};
        if (setrlimit(RLIMIT_FSIZE, &rl) < 0)
            _exit(10);
        tfevents_writer w;
        if (tfevents_open(&w, dir, 0, err, sizeof err) < 0)
            _exit(11);
        int64_t step = 1;
        int rc;
        for (;; step++) {
            tfevents_summary s;
            fill(&s, 48, step);
            if ((rc = tfevents_write(&w, 1.0, step, &s)) < 0)
                break;
        }
        if (rc != -ENOSPC && rc != -EFBIG)
            _exit(12);
        if (w.write_errors != 1 || w.fd < 0)
            _exit(13);
        struct stat st;
        if (fstat(w.fd, &st) < 0 || (uint64_t)st.st_size != w.size)
            _exit(14); /* the partial record was not cut off */
        tfevents_summary s;
        fill(&s, 1, step); /* a small one still fits: it must follow whole records */
        if (tfevents_write(&w, 1.0, step, &s) < 0)
            _exit(15);
        tfevents_close(&w);
        _exit(0);
    }
    int ws;
    T_ASSERT(waitpid(pid, &ws, 0) == pid);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        fprintf(stderr, "size-limit child: status %d\n", ws);
    T_ASSERT(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    only_file(dir, 1, path, sizeof path);
    size_t n, tail;
    uint8_t *buf = slurp(path, &n);
    static rec r[64];
    int k = split(buf, n, r, 64, &tail);
    T_ASSERT(tail == 0 && k >= 3);
    for (int i = 1; i < k - 1; i++) { /* the big ones in sequence, then the small one */
        tfevents_summary s;
        fill(&s, 48, i);
        T_ASSERT(memcmp(r[i].data + r[i].len - s.len, s.buf, s.len) == 0);
    }
    tfevents_summary s;
    fill(&s, 1, k - 1);
    T_ASSERT(r[k - 1].len > s.len && memcmp(r[k - 1].data + r[k - 1].len - s.len, s.buf, s.len) == 0);
    free(buf);
    printf("ok: a record cut short by the file size limit was cut off; %d whole records, a later small one "
           "after them\n",
           k);
}

static void test_summary_full(void)
{
    tfevents_summary s;
    tfevents_summary_init(&s);
    T_ASSERT(tfevents_summary_add(&s, "", 0, 1.0) == -EINVAL && s.dropped == 1);
    char tag[200];
    memset(tag, 't', sizeof tag);
    int added = 0, rc;
    while ((rc = tfevents_summary_add(&s, tag, sizeof tag, 1.0)) == 0)
        added++;
    T_ASSERT(rc == -ENOSPC && s.dropped == 2 && s.n == (uint32_t)added);
    T_ASSERT(s.len == (size_t)added * (2 + 2 + 2 + 200 + 5) && s.len <= TFEVENTS_SUMMARY_MAX);
    T_ASSERT_RC(tfevents_summary_add(&s, "x", 1, 2.0)); /* a smaller one still fits */
    char dir[128], path[4200], err[512];
    snprintf(dir, sizeof dir, "%s/full", root);
    tfevents_writer w;
    T_ASSERT_RC(tfevents_open(&w, dir, 0, err, sizeof err));
    T_ASSERT_RC(tfevents_write(&w, 2.0, 5, &s));
    tfevents_close(&w);
    only_file(dir, 1, path, sizeof path);
    size_t n, tail;
    uint8_t *buf = slurp(path, &n);
    rec r[4];
    T_ASSERT(split(buf, n, r, 4, &tail) == 2 && tail == 0);
    T_ASSERT(r[1].len > s.len && memcmp(r[1].data + r[1].len - s.len, s.buf, s.len) == 0);
    free(buf);
    printf("ok: a full summary drops values whole (%d of 200-byte tags fit), empty tags refused\n", added);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/df_tfevents.XXXXXX");
    T_ASSERT(mkdtemp(root));
    test_crc_varint();
    test_file_bytes();
    test_metrics_hook();
    test_kill();
    test_size_limit();
    test_summary_full();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    T_ASSERT(system(cmd) == 0);
    printf("test_tfevents: ok\n");
    return 0;
}
