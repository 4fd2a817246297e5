/* stage.c: busy/wait accounting and the periodic "stage" metrics line. */
#include "io/stage.h"

#include "util.h"

void stage_init(stage_stats *s, metrics_writer *mw, ring *in, ring *out, uint64_t interval_ns)
{
    memset(s, 0, sizeof *s);
    s->mw = mw;
    s->in = in;
    s->out = out;
    s->interval_ns = interval_ns;
    s->t0_ns = s->last_ns = s->mark_ns = df_now_ns();
}

static uint64_t lap(stage_stats *s)
{
    uint64_t now = df_now_ns(), d = now - s->mark_ns;
    s->mark_ns = now;
    return d;
}

void stage_busy(stage_stats *s)
{
    s->busy_ns += lap(s);
}
void stage_wait(stage_stats *s)
{
    s->wait_ns += lap(s);
}

void stage_count(stage_stats *s, uint64_t items, uint64_t tokens)
{
    s->items += items;
    s->tokens += tokens;
    s->items_total += items;
    s->tokens_total += tokens;
}

static void ring_fields(metrics_line *l, const char *prefix, ring *r)
{
    if (!r)
        return;
    ring_stats st;
    ring_stats_read(r, &st);
    char k[48];
    snprintf(k, sizeof k, "%s_ready", prefix);
    metrics_int(l, k, st.ready);
    snprintf(k, sizeof k, "%s_busy", prefix);
    metrics_int(l, k, st.writing + st.reading);
    snprintf(k, sizeof k, "%s_free", prefix);
    metrics_int(l, k, st.free);
}

void stage_tick(stage_stats *s, int force)
{
    uint64_t now = df_now_ns();
    if (!force && now - s->last_ns < s->interval_ns)
        return;
    double dt = (double)(now - s->last_ns) * 1e-9;
    if (dt <= 0)
        dt = 1e-9;
    s->busy_total_s += (double)s->busy_ns * 1e-9;
    s->wait_total_s += (double)s->wait_ns * 1e-9;
    if (s->mw) {
        metrics_line l;
        metrics_begin(&l, s->mw, "stage");
        metrics_num(&l, "busy_frac", (double)s->busy_ns * 1e-9 / dt);
        metrics_num(&l, "wait_frac", (double)s->wait_ns * 1e-9 / dt);
        metrics_num(&l, "items_s", (double)s->items / dt);
        metrics_num(&l, "tok_s", (double)s->tokens / dt);
        metrics_u64(&l, "items", s->items_total);
        metrics_u64(&l, "tokens", s->tokens_total);
        metrics_num(&l, "busy_s", s->busy_total_s);
        metrics_num(&l, "wait_s", s->wait_total_s);
        ring_fields(&l, "in", s->in);
        ring_fields(&l, "out", s->out);
        metrics_end(&l);
    }
    s->busy_ns = s->wait_ns = s->items = s->tokens = 0;
    s->last_ns = now;
}
