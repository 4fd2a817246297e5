/* grad_buckets.c: bucket plan and per-step hand-over for the overlapped gradient
 * all-reduce (grad_buckets.h). */
#include "dflash/grad_buckets.h"

#include "util.h"

#include <errno.h>
#include <string.h>

int buckets_plan_make(buckets_plan *p, const dflash_config *c, size_t bucket_floats)
{
    memset(p, 0, sizeof *p);
    size_t b[BUCKETS_MAX];
    int nb = dflash_grad_boundaries(c, b, BUCKETS_MAX);
    if (nb < 0)
        return nb;
    size_t hi = dflash_config_param_count(c);
    /* walk the boundaries in the order the backward reaches them; close a bucket when it is
     * big enough, and always at the last boundary (0) */
    for (int i = 0; i < nb; i++) {
        if (b[i] >= hi)
            return -EINVAL; /* boundaries must strictly decrease */
        if (hi - b[i] >= bucket_floats || b[i] == 0) {
            p->lo[p->n] = b[i];
            p->hi[p->n] = hi;
            p->n++;
            hi = b[i];
        }
    }
    return p->n > 0 && hi == 0 ? 0 : -EINVAL;
}

/* hand over every bucket whose lower end the backward has passed */
static void hand_over(buckets_step *s, size_t lo)
{
    const buckets_plan *p = s->plan;
    while (s->next < p->n && p->lo[s->next] >= lo) {
        int k = s->next++;
        char e2[sizeof s->err];
        int rc = allreduce_bucket_ready(s->ar, (uint32_t)k, s->g + p->lo[k], p->hi[k] - p->lo[k], e2, sizeof e2);
        if (rc < 0 && s->rc == 0) {
            s->rc = rc;
            memcpy(s->err, e2, sizeof s->err);
        }
    }
}

static void on_ready(void *arg, size_t lo)
{
    buckets_step *s = arg;
    int before = s->next;
    hand_over(s, lo);
    s->early += s->next - before;
}

void buckets_step_begin(buckets_step *s, const buckets_plan *p, allreduce_comm *ar, float *g)
{
    memset(s, 0, sizeof *s);
    s->plan = p;
    s->ar = ar;
    s->g = g;
    s->hook.ready = on_ready;
    s->hook.arg = s;
}

const dflash_grad_hook *buckets_step_hook(buckets_step *s)
{
    return &s->hook;
}

int buckets_step_finish(buckets_step *s, int64_t *wait_ns, char *err, size_t errlen)
{
    hand_over(s, 0);
    uint64_t t0 = df_now_ns();
    int rc = allreduce_wait_all(s->ar, err, errlen); /* always: it also starts the comm's next step */
    if (wait_ns)
        *wait_ns = (int64_t)(df_now_ns() - t0);
    if (s->rc < 0) {
        if (err && errlen)
            snprintf(err, errlen, "%s", s->err);
        return s->rc;
    }
    return rc;
}
