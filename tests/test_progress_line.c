/* test_progress_line.c: report_fit_fields, the width fitting of the orchestrator's progress
 * line on a terminal (orchestrator/report.c).
 *
 * For every width from 1 to past the full line, over field sets with mixed priorities, the
 * result is checked against the rule computed here on its own: fields are left out in the
 * order highest prio first (of equals, the later field first), as few as make the joined line
 * fit, then those left out come back, most important first, wherever they still fit; the kept
 * ones stay in their order, joined with " | "; a last field still too long is cut. Then the properties a reader relies on: never longer than the width, the most
 * important field always there (or its cut start), empty texts skipped, width 0 = everything.
 * tests/test_progress_tty.sh checks the drawn line on a real pseudo-terminal.
 */
#include <stdio.h>
#include <string.h>

#include "orchestrator/orch.h"
#include "test_helpers.h"

static void set(report_field *f, const char *text, int prio)
{
    snprintf(f->text, sizeof f->text, "%s", text);
    f->prio = prio;
}

static void join(const report_field *f, int n, const int *keep, char *out)
{
    out[0] = 0;
    for (int i = 0, kept = 0; i < n; i++)
        if (keep[i]) {
            if (kept++)
                strcat(out, " | ");
            strcat(out, f[i].text);
        }
}

static int count(const int *keep, int n)
{
    int c = 0;
    for (int i = 0; i < n; i++)
        c += keep[i];
    return c;
}

/* The expected line for width w, by the rule in words (independent of report.c's loop). */
static void expected(const report_field *f, int n, size_t w, char *out, size_t cap)
{
    int keep[REPORT_MAX_FIELDS], order[REPORT_MAX_FIELDS], no = 0;
    for (int i = 0; i < n; i++)
        keep[i] = f[i].text[0] != 0;
    /* the drop order: highest prio first, of equals the later field first */
    for (int p = 1000; p >= 0; p--)
        for (int i = n - 1; i >= 0; i--)
            if (keep[i] && f[i].prio == p)
                order[no++] = i;
    int k = 0;
    for (;; k++) {
        join(f, n, keep, out);
        if (w == 0 || strlen(out) <= w || count(keep, n) <= 1)
            break;
        keep[order[k]] = 0;
    }
    /* the fill: the dropped fields, most important first, back wherever the line still fits */
    for (int j = k - 1; j >= 0 && strlen(out) <= w; j--) {
        keep[order[j]] = 1;
        join(f, n, keep, out);
        if (strlen(out) > w) {
            keep[order[j]] = 0;
            join(f, n, keep, out);
        }
    }
    if (w && strlen(out) > w)
        out[w] = 0;
    (void)cap;
}

static void check_all_widths(const report_field *f, int n, const char *name)
{
    char full[8192], got[8192], want[8192];
    size_t len = report_fit_fields(f, n, 0, full, sizeof full);
    T_ASSERT(len == strlen(full));
    expected(f, n, 0, want, sizeof want);
    T_ASSERT_STREQ(full, want);
    int top = 0; /* the most important non-empty field: the first of the lowest prio */
    for (int i = 0; i < n; i++)
        if (f[i].text[0] && (!f[top].text[0] || f[i].prio < f[top].prio))
            top = i;
    for (size_t w = 1; w <= len + 5; w++) {
        size_t k = report_fit_fields(f, n, w, got, sizeof got);
        expected(f, n, w, want, sizeof want);
        if (strcmp(got, want) != 0) {
            fprintf(stderr, "%s, width %zu:\n  want \"%s\"\n  got  \"%s\"\n", name, w, want, got);
            exit(1);
        }
        T_ASSERT(k == strlen(got) && k <= w);
        /* the most important field is there whole, or (nothing else fits) its start */
        T_ASSERT(strstr(got, f[top].text) || !strncmp(got, f[top].text, w));
        if (w >= len)
            T_ASSERT_STREQ(got, full);
    }
    printf("ok: %s: widths 1..%zu fit, fields left out least important first\n", name, len + 5);
}

int main(void)
{
    static report_field f[REPORT_MAX_FIELDS];
    int n = 0;
    /* a run's terminal fields, as report.c makes them (priorities from its comment) */
    set(&f[n++], "[1m23s]", 0);
    set(&f[n++], "ledger 48/729", 0);
    set(&f[n++], "step 192/534", 1);
    set(&f[n++], "loss 1.882", 2);
    set(&f[n++], "ETA 5m51s", 1);
    set(&f[n++], "restarts 2 poisoned 0", 3);
    set(&f[n++], "839 tok/s", 4);
    set(&f[n++], "val 2.718 tau 1.55", 5);
    set(&f[n++], "lr 2.3e-03", 6);
    set(&f[n++], "target0 up 47.2/s", 7);
    set(&f[n++], "postproc0 backoff 0.0/s", 3);
    set(&f[n++], "drafter0 up 48.3/s", 7);
    set(&f[n++], "tp 0/4", 8);
    set(&f[n++], "pd 1/4", 8);
    check_all_widths(f, n, "a run's fields");

    /* by hand, at 80 columns - 1: everything from tokens/s on goes, then tokens/s, short
     * enough, comes back */
    char got[512];
    report_fit_fields(f, n, 79, got, sizeof got);
    T_ASSERT_STREQ(got, "[1m23s] | ledger 48/729 | step 192/534 | loss 1.882 | ETA 5m51s | 839 tok/s");
    report_fit_fields(f, n, 40, got, sizeof got);
    T_ASSERT_STREQ(got, "[1m23s] | ledger 48/729 | step 192/534");
    report_fit_fields(f, n, 10, got, sizeof got);
    T_ASSERT_STREQ(got, "[1m23s]");
    report_fit_fields(f, n, 5, got, sizeof got);
    T_ASSERT_STREQ(got, "[1m23");
    printf("ok: 79, 40, 10 and 5 columns by hand\n");

    /* empty texts are skipped, not joined as " |  | " */
    report_field g[4];
    set(&g[0], "a", 0);
    set(&g[1], "", 0);
    set(&g[2], "bb", 1);
    set(&g[3], "", 2);
    report_fit_fields(g, 4, 0, got, sizeof got);
    T_ASSERT_STREQ(got, "a | bb");
    check_all_widths(g, 4, "empty fields");

    /* every priority equal: the later fields go first; all distinct, reversed order */
    for (int i = 0; i < 20; i++) {
        char t[32];
        snprintf(t, sizeof t, "field%d", i * 7);
        set(&f[i], t, 4);
    }
    check_all_widths(f, 20, "equal priorities");
    for (int i = 0; i < 20; i++)
        f[i].prio = 19 - i;
    check_all_widths(f, 20, "priorities falling along the line");
    for (int i = 0; i < 20; i++)
        f[i].prio = (i * 7) % 5;
    check_all_widths(f, 20, "mixed priorities");

    /* a field as long as a field can be, as the only one */
    char big[sizeof f[0].text];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    set(&f[0], big, 0);
    check_all_widths(f, 1, "one long field");
    /* a small out buffer: never written past, NUL-terminated */
    char small[8];
    size_t k = report_fit_fields(f, 1, 0, small, sizeof small);
    T_ASSERT(k == 7 && strlen(small) == 7);
    printf("test_progress_line: all passed\n");
    return 0;
}
