/* test_topology.c: the topology parser. A table of malformed documents, each with the exact
 * message an operator would read (whole-string compare: the message IS the interface), the
 * fixture files under tests/topologies/ (syntax errors with line:column, a full and a minimal
 * valid topology checked field by field), configs/tiny.json, the normalised JSON round trip,
 * and topology_free on zeroed / half-filled structs (run it under SANITIZE=address for leaks).
 *
 * Inline documents are written with single quotes and turned into JSON by q() so the table
 * stays readable.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/topology.h"
#include "test_helpers.h"

#include <sys/stat.h>
#include <unistd.h>
#include "util.h"

static char *q(const char *s) /* 'x' -> "x" */
{
    char *r = strdup(s);
    T_ASSERT(r);
    for (char *p = r; *p; p++)
        if (*p == '\'')
            *p = '"';
    return r;
}

/* Building blocks of the inline cases: a valid head, two rings, three workers. */
#define HEAD                                                                                                           \
    "'version':1,'run_dir':'r','backend':'cpu','target':{'model_dir':'m','capture_layers':[1]},'data':{'shards':['s']" \
    "}"
#define RINGS "'rings':[{'name':'tp'},{'name':'pd'}]"
#define W_T "{'name':'t0','role':'target','out':'tp'}"
#define W_P "{'name':'p0','role':'postproc','in':'tp','out':'pd'}"
#define W_D "{'name':'d0','role':'drafter','in':'pd'}"
#define WORKERS "'workers':[" W_T "," W_P "," W_D "]"
#define W_V "{'name':'v','role':'validator'}"
#define W_V2 "{'name':'v2','role':'validator'}"
#define VAL(x) "'validation':{'shards':['h']," x "}"
#define DOC(...) "{" __VA_ARGS__ "}"
#define VALID DOC(HEAD "," RINGS "," WORKERS)
#define HEAD_CUDA                                                                                                      \
    "'version':1,'run_dir':'r','backend':'cuda','target':{'model_dir':'m','capture_layers':[1]},'data':{'shards':['s'" \
    "]}"

/* backend "cuda": rings and the three pipeline workers on GPU 0, then one more worker */
#define CUDA_PIPE(w)                                                                                                   \
    HEAD_CUDA ",'rings':[{'name':'tp','gpu':0},{'name':'pd','gpu':0}],'workers':[{'name':'t0','role':'target','out':'" \
              "tp','gpu':0},{'name':'p0','role':'postproc','in':'tp','out':'pd','gpu':0},{'name':'d0','role':'"        \
              "drafter','in':'pd','gpu':0}," w "]"

typedef struct bad_case {
    const char *doc;
    const char *msg; /* exact, with source name "t" */
} bad_case;

static const bad_case bad_cases[] = {
    /* syntax (jansson's text, with line:column) */
    {"{'version':1,", "t:1:13: JSON syntax error: string or '}' expected near end of file"},
    {"{'version':1,'version':1}", "t:1:22: JSON syntax error: duplicate object key near '\"version\"'"},
    {"", "t:1:0: JSON syntax error: '[' or '{' expected near end of file"},
    /* top level */
    {"[1]", "t: (top level): expected an object, got an array"},
    {DOC("'verison':1," HEAD "," RINGS "," WORKERS), "t: verison: unknown key"},
    {DOC("'run_dir':'r','backend':'cpu'"), "t: version: required key missing"},
    {DOC("'version':2," RINGS), "t: version: expected 1, got 2"},
    {DOC("'version':1,'backend':'cpu'"), "t: run_dir: required key missing"},
    {DOC("'version':1,'run_dir':''"), "t: run_dir: expected a non-empty string, got \"\""},
    {DOC("'version':1,'run_dir':'r','backend':'gpu'"), "t: backend: expected \"cpu\" or \"cuda\", got \"gpu\""},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','seed':-1"), "t: seed: expected an integer >= 0, got -1"},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','seed':1.5"), "t: seed: expected an integer >= 0, got 1.5"},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','deterministic':1"),
     "t: deterministic: expected true or false, got 1"},
    {DOC("'version':1,'name':'my run','run_dir':'r'"),
     "t: name: expected 1..63 characters [A-Za-z0-9_.-], got \"my run\""},
    /* target */
    {DOC("'version':1,'run_dir':'r','backend':'cpu'"), "t: target: required key missing"},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','target':[]"), "t: target: expected an object, got an array"},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','target':{'model_dir':'m','layers':[1]}"),
     "t: target.layers: unknown key"},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','target':{'capture_layers':[1]}"),
     "t: target.model_dir: required key missing"},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','target':{'model_dir':'m'}"),
     "t: target.capture_layers: required key missing"},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','target':{'model_dir':'m','capture_layers':[]}"),
     "t: target.capture_layers: expected a non-empty array (at most 256) of layer indices, got an array that is empty"},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','target':{'model_dir':'m','capture_layers':[1,'a']}"),
     "t: target.capture_layers[1]: expected an integer 0..1023, got \"a\""},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','target':{'model_dir':'m','capture_layers':[3,3]}"),
     "t: target.capture_layers[1]: expected an integer > 3 (strictly increasing), got 3"},
    /* drafter */
    {DOC(HEAD ",'drafter':{'lr':0}"), "t: drafter.lr: expected a number in (0, 10], got 0"},
    {DOC(HEAD ",'drafter':{'warmup_frac':1.5}"), "t: drafter.warmup_frac: expected a number 0..1, got 1.5"},
    {DOC(HEAD ",'drafter':{'gamma':'7'}"), "t: drafter.gamma: expected a number > 0, got \"7\""},
    {DOC(HEAD ",'drafter':{'loss':'DPACE'}"), "t: drafter.loss: expected \"decay\" or \"dpace\", got \"DPACE\""},
    {DOC(HEAD ",'drafter':{'loss':1}"), "t: drafter.loss: expected \"decay\" or \"dpace\", got 1"},
    {DOC(HEAD ",'drafter':{'loss':'dpace','dpace_alpha':0}"),
     "t: drafter.dpace_alpha: expected a number in (0, 1], got 0"},
    {DOC(HEAD ",'drafter':{'dpace_alpha':1.5}"), "t: drafter.dpace_alpha: expected a number in (0, 1], got 1.5"},
    {DOC(HEAD ",'drafter':{'block_size':1}"), "t: drafter.block_size: expected an integer 2..1024, got 1"},
    {DOC(HEAD ",'drafter':{'mask_token_id':-2}"),
     "t: drafter.mask_token_id: expected an integer 0..2147483647 or null, got -2"},
    {DOC(HEAD ",'drafter':{'init_dir':5}"), "t: drafter.init_dir: expected a non-empty string or null, got 5"},
    {DOC(HEAD ",'drafter':{'epoch':2}"), "t: drafter.epoch: unknown key"},
    {DOC(HEAD ",'drafter':{'keep_checkpoints':-1}"),
     "t: drafter.keep_checkpoints: expected an integer 0..1000000, got -1"},
    {DOC(HEAD ",'drafter':{'keep_checkpoints':'3'}"),
     "t: drafter.keep_checkpoints: expected an integer 0..1000000, got \"3\""},
    {DOC(HEAD ",'drafter':{'max_checkpoint_failures':0}"),
     "t: drafter.max_checkpoint_failures: expected an integer 1..1000000, got 0"},
    {DOC(HEAD ",'drafter':{'max_checkpoint_failures':2.5}"),
     "t: drafter.max_checkpoint_failures: expected an integer 1..1000000, got 2.5"},
    {DOC(HEAD ",'drafter':{'max_nonfinite_steps':0}"),
     "t: drafter.max_nonfinite_steps: expected an integer 1..1000000, got 0"},
    {DOC(HEAD ",'drafter':{'max_nonfinite_steps':'3'}"),
     "t: drafter.max_nonfinite_steps: expected an integer 1..1000000, got \"3\""},
    {DOC(HEAD ",'drafter':{'allreduce_bucket_kb':4194305}"),
     "t: drafter.allreduce_bucket_kb: expected an integer 0..4194304, got 4194305"},
    {DOC(HEAD ",'drafter':{'allreduce_bucket_kb':-1}"),
     "t: drafter.allreduce_bucket_kb: expected an integer 0..4194304, got -1"},
    /* drafter.layer_types and sliding_window: one kind per layer, a window exactly when a layer slides */
    {DOC(HEAD ",'drafter':{'num_layers':2,'layer_types':['full_attention']}"),
     "t: drafter.layer_types: expected an array of drafter.num_layers (2) strings \"full_attention\" or "
     "\"sliding_attention\", or null, got an array of 1"},
    {DOC(HEAD ",'drafter':{'layer_types':['full_attention','full_attention']}"),
     "t: drafter.layer_types: expected an array of drafter.num_layers (1) strings \"full_attention\" or "
     "\"sliding_attention\", or null, got an array of 2"},
    {DOC(HEAD ",'drafter':{'layer_types':'sliding_attention','sliding_window':8}"),
     "t: drafter.layer_types: expected an array of drafter.num_layers (1) strings \"full_attention\" or "
     "\"sliding_attention\", or null, got \"sliding_attention\""},
    {DOC(HEAD ",'drafter':{'num_layers':2,'layer_types':['full_attention','sliding'],'sliding_window':8}"),
     "t: drafter.layer_types[1]: expected \"full_attention\" or \"sliding_attention\", got \"sliding\""},
    {DOC(HEAD ",'drafter':{'layer_types':[0]}"),
     "t: drafter.layer_types[0]: expected \"full_attention\" or \"sliding_attention\", got 0"},
    {DOC(HEAD ",'drafter':{'layer_types':['Full_Attention']}"),
     "t: drafter.layer_types[0]: expected \"full_attention\" or \"sliding_attention\", got \"Full_Attention\""},
    {DOC(HEAD ",'drafter':{'num_layers':2,'layer_types':['full_attention','sliding_attention']}"),
     "t: drafter.sliding_window: expected an integer 1..2147483647 (drafter.layer_types[1] is \"sliding_attention\"), "
     "got nothing"},
    {DOC(HEAD ",'drafter':{'layer_types':['sliding_attention'],'sliding_window':null}"),
     "t: drafter.sliding_window: expected an integer 1..2147483647 (drafter.layer_types[0] is \"sliding_attention\"), "
     "got null"},
    {DOC(HEAD ",'drafter':{'sliding_window':8}"), "t: drafter.sliding_window: expected null (no drafter.layer_types "
                                                  "entry is \"sliding_attention\": the window would "
                                                  "be unused), got 8"},
    {DOC(HEAD ",'drafter':{'num_layers':2,'layer_types':['full_attention','full_attention'],'sliding_window':8}"),
     "t: drafter.sliding_window: expected null (no drafter.layer_types entry is \"sliding_attention\": the window "
     "would "
     "be unused), got 8"},
    {DOC(HEAD ",'drafter':{'layer_types':['sliding_attention'],'sliding_window':0}"),
     "t: drafter.sliding_window: expected an integer 1..2147483647 or null, got 0"},
    {DOC(HEAD ",'drafter':{'layer_types':['sliding_attention'],'sliding_window':-8}"),
     "t: drafter.sliding_window: expected an integer 1..2147483647 or null, got -8"},
    {DOC(HEAD ",'drafter':{'layer_types':['sliding_attention'],'sliding_window':8.5}"),
     "t: drafter.sliding_window: expected an integer 1..2147483647 or null, got 8.5"},
    {DOC(HEAD ",'drafter':{'layer_types':['sliding_attention'],'sliding_window':'8'}"),
     "t: drafter.sliding_window: expected an integer 1..2147483647 or null, got \"8\""},
    {DOC(HEAD ",'drafter':{'layer_types':['sliding_attention'],'sliding_window':2147483648}"),
     "t: drafter.sliding_window: expected an integer 1..2147483647 or null, got 2147483648"},
    {DOC(HEAD ",'drafter':{'sliding_windows':8}"), "t: drafter.sliding_windows: unknown key"},
    /* data */
    {DOC("'version':1,'run_dir':'r','backend':'cpu','target':{'model_dir':'m','capture_layers':[1]},'data':{}"),
     "t: data.shards: required key missing"},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','target':{'model_dir':'m','capture_layers':[1]},'data':{'shards':['"
         "a',7]}"),
     "t: data.shards[1]: expected a non-empty string, got 7"},
    {DOC("'version':1,'run_dir':'r','backend':'cpu','target':{'model_dir':'m','capture_layers':[1]},'data':{'shards':['"
         "a'],'token_budget':256}"),
     "t: data.token_budget: expected at least data.max_seq_len (512), got 256"},
    /* supervision */
    {DOC(HEAD ",'supervision':{'backoff_initial_ms':500,'backoff_max_ms':100}"),
     "t: supervision.backoff_max_ms: expected at least supervision.backoff_initial_ms (500), got 100"},
    {DOC(HEAD ",'supervision':{'heartbeat_ms':5}"), "t: supervision.heartbeat_ms: unknown key"},
    /* rings */
    {DOC(HEAD ",'rings':[]," WORKERS), "t: rings: expected an array of 1..16 rings, got 0"},
    {DOC(HEAD ",'rings':{}," WORKERS), "t: rings: expected an array of 1..16 rings, got an object"},
    {DOC(HEAD ",'rings':[{'name':'tp','slots':0}]"), "t: rings[0].slots: expected an integer 1..4096, got 0"},
    {DOC(HEAD ",'rings':[{'name':'tp','slot_bytes':100}]"),
     "t: rings[0].slot_bytes: expected an integer 4096..1099511627776, got 100"},
    {DOC(HEAD ",'rings':[{'name':'tp','max_attempts':101}]"),
     "t: rings[0].max_attempts: expected an integer 1..100, got 101"},
    {DOC(HEAD ",'rings':[{'name':'TP'}]"), "t: rings[0].name: expected 1..31 characters [a-z0-9_-], got \"TP\""},
    {DOC(HEAD ",'rings':[{'name':'tp'},{'name':'tp'}]"),
     "t: rings[1].name: duplicate ring name \"tp\" (also rings[0])"},
    {DOC(HEAD ",'rings':[{'name':'tp','gpu':0}]"), "t: rings[0].gpu: expected -1 with backend \"cpu\", got 0"},
    {DOC(HEAD ",'rings':[{'slots':4}]"), "t: rings[0].name: required key missing"},
    /* workers */
    {DOC(HEAD "," RINGS ",'workers':[]"), "t: workers: expected an array of 1..64 workers, got 0"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T ",3]"), "t: workers[1]: expected an object, got 3"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T ",{'name':'p0','role':'postproc','gpuu':0}]"),
     "t: workers[1].gpuu: unknown key"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P ",{'name':'d0','role':'drafter','in':'pd','gpu':'a'}]"),
     "t: workers[2].gpu: expected an integer -1..7, got \"a\""},
    {DOC(HEAD "," RINGS ",'workers':[" W_T ",{'name':'p0','role':'postproc','in':'tq','out':'pd'}]"),
     "t: workers[1].in: unknown ring \"tq\""},
    {DOC(HEAD "," RINGS ",'workers':[{'name':'t0','role':'trainer'}]"),
     "t: workers[0].role: expected \"target\", \"postproc\", \"drafter\", \"validator\" or \"test\", got \"trainer\""},
    /* validation and the validator */
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P "," W_D "," W_V "]"),
     "t: workers[3].role: a validator needs the top-level \"validation\" section (its held-out shards)"},
    {DOC(HEAD "," RINGS "," WORKERS "," VAL("'every_steps':100")),
     "t: validation: no worker has role \"validator\" (add one, or remove this section)"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P "," W_D "," W_V "," W_V2 "]," VAL("'every_steps':100")),
     "t: workers[4].role: a second validator (workers[3] is one): at most one worker has role \"validator\""},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P "," W_D "," W_V "]," VAL("'every_steps':75")),
     "t: validation.every_steps: expected a multiple of drafter.checkpoint_every (50): validation scores checkpoints, "
     "got 75"},
    {DOC(HEAD ",'drafter':{'checkpoint_every':20}," RINGS ",'workers':[" W_T "," W_P "," W_D "," W_V
              "]," VAL("'every_steps':50")),
     "t: validation.every_steps: expected a multiple of drafter.checkpoint_every (20): validation scores checkpoints, "
     "got 50"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P "," W_D "," W_V "],'validation':{'shards':[]}"),
     "t: validation.shards: expected a non-empty array of file names, got an array that is empty"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P "," W_D "," W_V "],'validation':{'max_samples':4}"),
     "t: validation.shards: required key missing"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P "," W_D "," W_V "]," VAL("'max_samples':0")),
     "t: validation.max_samples: expected an integer 1..1000000, got 0"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P "," W_D "," W_V "]," VAL("'every':5")),
     "t: validation.every: unknown key"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P "," W_D
              ",{'name':'v','role':'validator','in':'pd'}]," VAL("'every_steps':0")),
     "t: workers[3].in: a validator worker reads and writes no ring (it reads checkpoints; remove \"in\")"},
    {DOC(CUDA_PIPE("{'name':'v','role':'validator','gpu':8}") "," VAL("'every_steps':0")),
     "t: workers[3].gpu: expected an integer -1..7, got 8"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P "," W_D
              ",{'name':'v','role':'validator','gpu':0}]," VAL("'every_steps':0")),
     "t: workers[3].gpu: expected -1 with backend \"cpu\" (a GPU validator needs backend \"cuda\"), got 0"},
    {DOC(HEAD "," RINGS ",'workers':[{'name':'t0'}]"), "t: workers[0].role: required key missing"},
    {DOC(HEAD "," RINGS ",'workers':[{'name':'t0','role':'target','in':'pd','out':'tp'}]"),
     "t: workers[0].in: a target worker reads no ring (remove \"in\")"},
    {DOC(HEAD "," RINGS ",'workers':[{'name':'d0','role':'drafter','in':'pd','out':'tp'}]"),
     "t: workers[0].out: a drafter worker writes no ring (remove \"out\")"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T ",{'name':'p0','role':'postproc','in':'tp'}]"),
     "t: workers[1].out: required for role \"postproc\""},
    {DOC(HEAD "," RINGS ",'workers':[{'name':'d0','role':'drafter'}]"),
     "t: workers[0].in: required for role \"drafter\""},
    {DOC(HEAD "," RINGS ",'workers':[{'name':'x','role':'test','in':'tp','out':'tp'}]"),
     "t: workers[0].out: same ring as \"in\" (\"tp\")"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P ",{'name':'t0','role':'drafter','in':'pd'}]"),
     "t: workers[2].name: duplicate worker name \"t0\" (also workers[0])"},
    {DOC(HEAD "," RINGS ",'workers':[{'name':'t0','role':'target','out':'tp','rank':0}]"),
     "t: workers[0].rank: only drafter workers have a rank"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P
              ",{'name':'d0','role':'drafter','in':'pd','rank':2},{'name':'d1','role':'drafter','in':'pd'}]"),
     "t: workers[2].rank: expected an integer 0..1, got 2"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P
              ",{'name':'d0','role':'drafter','in':'pd','rank':1},{'name':'d1','role':'drafter','in':'pd'}]"),
     "t: workers[3].rank: rank 1 is already taken by workers[2] (drafter ranks must be 0..1, each once)"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P "]"),
     "t: rings[1]: ring \"pd\" has no consumer (no worker has \"in\": \"pd\")"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T
              ",{'name':'d0','role':'drafter','in':'tp'},{'name':'d1','role':'drafter','in':'pd'}]"),
     "t: rings[1]: ring \"pd\" has no producer (no worker has \"out\": \"pd\")"},
    /* the ring graph: stage order target -> postproc -> drafter, no cycle */
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P
              ",{'name':'d0','role':'drafter','in':'tp'},{'name':'d1','role':'drafter','in':'pd'}]"),
     "t: workers[2].in: ring \"tp\" is written by workers[0] \"t0\" (role target), but a drafter reads only what a "
     "postproc writes (stage order target -> postproc -> drafter)"},
    {DOC(HEAD ",'rings':[{'name':'tp'},{'name':'pp'},{'name':'pd'}],'workers':[" W_T
              ",{'name':'p0','role':'postproc','in':'tp','out':'pp'},"
              "{'name':'p1','role':'postproc','in':'pp','out':'pd'}," W_D "]"),
     "t: workers[2].in: ring \"pp\" is written by workers[1] \"p0\" (role postproc), but a postproc reads only what a "
     "target writes (stage order target -> postproc -> drafter)"},
    {DOC(HEAD "," RINGS ",'workers':[{'name':'a','role':'test','in':'tp','out':'pd'},{'name':'b','role':'test','in':'"
              "pd','out':'tp'}]"),
     "t: rings[0]: ring \"tp\" is part of a cycle: tp -> workers[0] \"a\" -> pd -> workers[1] \"b\" -> tp (batches "
     "would flow back into it)"},
    {DOC(HEAD ",'rings':[{'name':'src'},{'name':'tp'},{'name':'pd'}],'workers':[{'name':'s','role':'test','out':'src'},"
              "{'name':'m','role':'test','in':'src','out':'tp'},{'name':'p0','role':'postproc','in':'tp','out':'pd'},"
              "{'name':'x','role':'test','in':'pd','out':'tp'},{'name':'c','role':'test','in':'pd'}]"),
     "t: rings[1]: ring \"tp\" is part of a cycle: tp -> workers[2] \"p0\" -> pd -> workers[3] \"x\" -> tp (batches "
     "would flow back into it)"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P
              ",{'name':'d0','role':'drafter','in':'pd','heartbeat_timeout_ms':0}]"),
     "t: workers[2].heartbeat_timeout_ms: expected an integer 100..86400000, got 0"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P
              ",{'name':'d0','role':'drafter','in':'pd','startup_timeout_ms':99}]"),
     "t: workers[2].startup_timeout_ms: expected an integer 100..86400000, got 99"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P ",{'name':'d0','role':'drafter','in':'pd','env':{'1X':'a'}}]"),
     "t: workers[2].env.1X: expected a variable name [A-Za-z_][A-Za-z0-9_]*"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P ",{'name':'d0','role':'drafter','in':'pd','env':{'X':1}}]"),
     "t: workers[2].env.X: expected a string, got 1"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P ",{'name':'d0','role':'drafter','in':'pd','args':['-v',false]}]"),
     "t: workers[2].args[1]: expected a string, got false"},
    {DOC(HEAD "," RINGS ",'workers':[" W_T "," W_P ",{'name':'d0','role':'drafter','in':'pd','args':'-v'}]"),
     "t: workers[2].args: expected an array of strings, got \"-v\""},
    /* backend vs gpu */
    {DOC(HEAD_CUDA ",'rings':[{'name':'tp','gpu':0}],'workers':[{'name':'t0','role':'target','out':'tp'}]"),
     "t: workers[0].gpu: required with backend \"cuda\""},
    {DOC(HEAD_CUDA ",'rings':[{'name':'tp','gpu':0}],'workers':[{'name':'t0','role':'target','out':'tp','gpu':-1}]"),
     "t: workers[0].gpu: expected an integer 0..7 with backend \"cuda\", got -1"},
    {DOC(HEAD_CUDA ",'rings':[{'name':'tp','gpu':8}]"), "t: rings[0].gpu: expected an integer -1..7, got 8"},
    /* description */
    {DOC(HEAD "," RINGS "," WORKERS ",'description':3"), "t: description: expected a non-empty string or null, got 3"},
    {DOC(HEAD "," RINGS "," WORKERS ",'description':''"),
     "t: description: expected a non-empty string or null, got \"\""},
    {DOC(HEAD "," RINGS "," WORKERS ",'description':['a']"),
     "t: description: expected a non-empty string or null, got an array"},
    {DOC(HEAD "," RINGS "," WORKERS ",'descripton':'a'"), "t: descripton: unknown key"},
    /* binaries */
    {DOC(HEAD "," RINGS "," WORKERS ",'binaries':{'dir':3}"),
     "t: binaries.dir: expected a non-empty string or null, got 3"},
    {DOC(HEAD "," RINGS "," WORKERS ",'binaries':{'path':'x'}"), "t: binaries.path: unknown key"},
};

/* Fixture files: the message names the file, syntax errors carry line:column. */
static const bad_case bad_files[] = {
    {"tests/topologies/bad/syntax_missing_comma.json",
     "tests/topologies/bad/syntax_missing_comma.json:4:11: JSON syntax error: '}' expected near '\"backend\"'"},
    {"tests/topologies/bad/duplicate_key.json",
     "tests/topologies/bad/duplicate_key.json:5:11: JSON syntax error: duplicate object key near '\"backend\"'"},
    {"tests/topologies/bad/trailing_comma.json",
     "tests/topologies/bad/trailing_comma.json:3:30: JSON syntax error: string or '}' expected near '}'"},
    {"tests/topologies/bad/empty.json",
     "tests/topologies/bad/empty.json:1:0: JSON syntax error: '[' or '{' expected near end of file"},
    {"tests/topologies/bad/gpu_typo.json", "tests/topologies/bad/gpu_typo.json: workers[1].gpuu: unknown key"},
};

static int is_zeroed(const topo *t)
{
    static const topo zero;
    return memcmp(t, &zero, sizeof zero) == 0;
}

static void test_bad_cases(void)
{
    int n = 0, failed = 0;
    for (size_t i = 0; i < DF_ARRAY_LEN(bad_cases); i++) {
        char *doc = q(bad_cases[i].doc);
        topo t;
        char err[512];
        int rc = topology_parse(&t, doc, "t", err, sizeof err);
        if (rc != -EINVAL || strcmp(err, bad_cases[i].msg) != 0) { /* report all, then fail */
            fprintf(stderr, "case %zu: %s\n  rc=%d\n  expected: %s\n  got:      %s\n", i, doc, rc, bad_cases[i].msg,
                    err);
            failed++;
        }
        T_ASSERT(is_zeroed(&t)); /* a failed parse frees what it filled */
        free(doc);
        n++;
    }
    for (size_t i = 0; i < DF_ARRAY_LEN(bad_files); i++) {
        topo t;
        char err[512];
        int rc = topology_load(&t, bad_files[i].doc, err, sizeof err);
        if (rc != -EINVAL || strcmp(err, bad_files[i].msg) != 0) {
            fprintf(stderr, "file %s: rc=%d\n  expected: %s\n  got:      %s\n", bad_files[i].doc, rc, bad_files[i].msg,
                    err);
            failed++;
        }
        T_ASSERT(is_zeroed(&t));
        n++;
    }
    T_ASSERT(failed == 0);
    T_ASSERT(n >= 25);
    printf("ok: %d malformed topologies rejected with their exact messages\n", n);
}

static void test_missing_file(void)
{
    topo t;
    char err[512];
    int rc = topology_load(&t, "tests/topologies/does-not-exist.json", err, sizeof err);
    T_ASSERT(rc == -ENOENT);
    T_ASSERT_STREQ(err,
                   "tests/topologies/does-not-exist.json: cannot read the topology file: No such file or directory");
    T_ASSERT(is_zeroed(&t));
    rc = topology_load(&t, "tests/topologies", err, sizeof err); /* a directory */
    T_ASSERT(rc < 0);
    T_ASSERT_STREQ(err, "tests/topologies: is a directory, not a regular file (the topology file)");
    /* a FIFO: refused at once (a plain open would wait for a writer forever) */
    char fifo[] = "/tmp/df_test_topo_fifo_XXXXXX";
    int tfd = mkstemp(fifo);
    T_ASSERT(tfd >= 0 && close(tfd) == 0 && unlink(fifo) == 0 && mkfifo(fifo, 0600) == 0);
    rc = topology_load(&t, fifo, err, sizeof err);
    T_ASSERT(rc == -EINVAL && is_zeroed(&t));
    char want[128];
    snprintf(want, sizeof want, "%s: is a FIFO (named pipe), not a regular file (the topology file)", fifo);
    T_ASSERT_STREQ(err, want);
    unlink(fifo);
    printf("ok: unreadable files named in the message\n");
}

static int strv_len(char **v)
{
    int n = 0;
    while (v && v[n])
        n++;
    return n;
}

static void check_minimal_defaults(const topo *t)
{
    T_ASSERT(t->version == 1);
    T_ASSERT_STREQ(t->name, "default");
    T_ASSERT_STREQ(t->run_dir, "run/min");
    T_ASSERT(t->backend == TOPOLOGY_CPU);
    T_ASSERT(t->seed == 1234);
    T_ASSERT(t->deterministic == 0);
    T_ASSERT_STREQ(t->target_model_dir, "m");
    T_ASSERT(t->n_capture == 1 && t->capture_layers[0] == 2);
    const topology_drafter *d = &t->drafter;
    T_ASSERT(d->num_layers == 1 && d->block_size == 16 && d->num_anchors == 64);
    T_ASSERT(d->gamma == 7.0 && d->lr == 6e-4 && d->warmup_frac == 0.04);
    T_ASSERT(d->loss == TOPOLOGY_LOSS_DECAY && d->dpace_alpha == 0.5);
    T_ASSERT(d->weight_decay == 0.0 && d->grad_clip == 1.0 && d->noise_std == 0.0);
    T_ASSERT(d->epochs == 1 && d->checkpoint_every == 50);
    T_ASSERT(d->keep_checkpoints == 3 && d->max_checkpoint_failures == 3 && d->allreduce_bucket_kb == 16384);
    T_ASSERT(d->max_nonfinite_steps == 3);
    T_ASSERT(d->init_dir == NULL && d->mask_token_id == -1);
    T_ASSERT(!d->layer_types_given && d->sliding_window == 0);
    for (int l = 0; l < TOPOLOGY_MAX_DRAFTER_LAYERS; l++)
        T_ASSERT(d->layer_sliding[l] == 0);
    T_ASSERT(t->n_shards == 1);
    T_ASSERT_STREQ(t->shards[0], "s.dfs");
    T_ASSERT(t->token_budget == 2048 && t->max_seq_len == 512);
    T_ASSERT(t->n_rings == 2);
    T_ASSERT_STREQ(t->rings[0].name, "tp");
    T_ASSERT_STREQ(t->rings[1].name, "pd");
    T_ASSERT(t->rings[0].slots == 8 && t->rings[0].slot_bytes == 4194304);
    T_ASSERT(t->rings[0].max_attempts == 3 && t->rings[0].gpu == -1);
    T_ASSERT(t->n_workers == 3);
    const topology_worker *w0 = &t->workers[0], *w1 = &t->workers[2];
    T_ASSERT_STREQ(w0->name, "t0");
    T_ASSERT(w0->role == TOPOLOGY_ROLE_TARGET && w0->gpu == -1 && w0->in_ring == -1 && w0->out_ring == 0);
    T_ASSERT(w0->rank == -1 && w0->heartbeat_timeout_ms == 10000 && w0->startup_timeout_ms == 600000);
    T_ASSERT(w0->env && !w0->env[0] && w0->args && !w0->args[0]);
    T_ASSERT_STREQ(w1->name, "d0");
    T_ASSERT(w1->role == TOPOLOGY_ROLE_DRAFTER && w1->in_ring == 1 && w1->out_ring == -1 && w1->rank == 0);
    T_ASSERT(t->workers[1].role == TOPOLOGY_ROLE_POSTPROC && t->workers[1].in_ring == 0 && t->workers[1].out_ring == 1);
    const topology_supervision *s = &t->sup;
    T_ASSERT(s->backoff_initial_ms == 100 && s->backoff_max_ms == 5000 && s->stable_ms == 10000);
    T_ASSERT(s->max_restarts == 5 && s->restart_window_s == 60 && s->heartbeat_timeout_ms == 10000);
    T_ASSERT(s->startup_timeout_ms == 600000 && t->drafter.checkpoint_async == 1);
    T_ASSERT(s->shutdown_timeout_ms == 5000 && s->metrics_interval_ms == 1000);
    T_ASSERT(t->bin_dir == NULL);
    T_ASSERT_STREQ(t->source_path, "tests/topologies/good/minimal.json");
}

static void check_full(const topo *t)
{
    T_ASSERT_STREQ(t->name, "full-2x");
    T_ASSERT_STREQ(t->description, "every field set: a parser fixture, not a recipe");
    T_ASSERT_STREQ(t->run_dir, "/tmp/run/full");
    T_ASSERT(t->backend == TOPOLOGY_CUDA && t->seed == 99 && t->deterministic == 0);
    T_ASSERT_STREQ(t->target_model_dir, "models/qwen3-8b");
    static const int cl[] = {1, 9, 17, 25, 33};
    T_ASSERT(t->n_capture == 5);
    for (int i = 0; i < 5; i++)
        T_ASSERT(t->capture_layers[i] == cl[i]);
    const topology_drafter *d = &t->drafter;
    T_ASSERT(d->num_layers == 5 && d->block_size == 10 && d->num_anchors == 512);
    T_ASSERT(d->gamma == 4.5 && d->lr == 0.0003 && d->warmup_frac == 0.1 && d->weight_decay == 0.01);
    T_ASSERT(d->grad_clip == 0.5 && d->noise_std == 0.25 && d->epochs == 3 && d->checkpoint_every == 200);
    T_ASSERT(d->loss == TOPOLOGY_LOSS_DPACE && d->dpace_alpha == 0.25);
    T_ASSERT_STREQ(d->init_dir, "ckpt/init");
    T_ASSERT(d->mask_token_id == 151669);
    static const uint8_t sl[] = {1, 0, 1, 0, 0};
    T_ASSERT(d->layer_types_given && d->sliding_window == 2048);
    for (int l = 0; l < TOPOLOGY_MAX_DRAFTER_LAYERS; l++)
        T_ASSERT(d->layer_sliding[l] == (l < 5 ? sl[l] : 0));
    T_ASSERT(t->n_shards == 2);
    T_ASSERT_STREQ(t->shards[1], "data/a-001.dfs");
    T_ASSERT(t->token_budget == 65536 && t->max_seq_len == 4096);
    T_ASSERT(t->n_rings == 2);
    T_ASSERT_STREQ(t->rings[1].name, "pd");
    T_ASSERT(t->rings[0].slots == 16 && t->rings[0].slot_bytes == 268435456ull);
    T_ASSERT(t->rings[0].max_attempts == 5 && t->rings[0].gpu == 0);
    T_ASSERT(t->rings[1].slots == 4 && t->rings[1].slot_bytes == 134217728ull);
    T_ASSERT(t->rings[1].max_attempts == 2 && t->rings[1].gpu == 1);
    T_ASSERT(t->n_workers == 5 && topology_n_drafters(t) == 2);
    T_ASSERT(t->workers[1].gpu == 2 && t->workers[1].out_ring == 0 && t->workers[1].heartbeat_timeout_ms == 60000);
    T_ASSERT(t->workers[1].startup_timeout_ms == 900000);
    T_ASSERT(t->workers[0].heartbeat_timeout_ms == 15000 &&
             t->workers[0].startup_timeout_ms == 120000); /* supervision */
    T_ASSERT(t->drafter.checkpoint_async == 0);
    const topology_worker *p = &t->workers[2];
    T_ASSERT(p->role == TOPOLOGY_ROLE_POSTPROC && p->in_ring == 0 && p->out_ring == 1);
    T_ASSERT(strv_len(p->env) == 2);
    T_ASSERT_STREQ(p->env[0], "OMP_NUM_THREADS=4");
    T_ASSERT_STREQ(p->env[1], "DF_TRACE=");
    const topology_worker *d0 = &t->workers[3], *d1 = &t->workers[4];
    T_ASSERT(d0->rank == 1 && d1->rank == 0 && d0->gpu == 1 && d1->gpu == 3);
    T_ASSERT(strv_len(d0->args) == 2);
    T_ASSERT_STREQ(d0->args[0], "--extra");
    T_ASSERT_STREQ(d0->args[1], "-v");
    T_ASSERT(strv_len(d1->args) == 0);
    const topology_supervision *s = &t->sup;
    T_ASSERT(s->backoff_initial_ms == 50 && s->backoff_max_ms == 8000 && s->stable_ms == 20000);
    T_ASSERT(s->max_restarts == 7 && s->restart_window_s == 120 && s->heartbeat_timeout_ms == 15000);
    T_ASSERT(s->shutdown_timeout_ms == 3000 && s->metrics_interval_ms == 500);
    T_ASSERT_STREQ(t->bin_dir, "/opt/dflash/bin");
    T_ASSERT(topology_find_worker(t, "drafter1") == 4 && topology_find_worker(t, "nobody") == -1);
    T_ASSERT(topology_find_ring(t, "pd") == 1 && topology_find_ring(t, "xx") == -1);
    T_ASSERT_STREQ(topology_role_name(TOPOLOGY_ROLE_POSTPROC), "postproc");
    T_ASSERT_STREQ(topology_role_name(TOPOLOGY_ROLE_TEST), "test");
    T_ASSERT_STREQ(topology_backend_name(TOPOLOGY_CUDA), "cuda");
}

/* topology_to_json -> text -> topology_parse -> topology_to_json gives the same JSON. */
static void check_round_trip(const topo *t)
{
    json_t *j1 = topology_to_json(t);
    T_ASSERT(j1);
    char *text = json_dumps(j1, JSON_INDENT(2));
    T_ASSERT(text);
    topo t2;
    char err[512];
    int rc = topology_parse(&t2, text, "normalised", err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n%s\n", err, text);
    T_ASSERT(rc == 0);
    json_t *j2 = topology_to_json(&t2);
    T_ASSERT(j2 && json_equal(j1, j2));
    T_ASSERT(t2.drafter.lr == t->drafter.lr && t2.drafter.gamma == t->drafter.gamma);
    T_ASSERT(t2.drafter.loss == t->drafter.loss && t2.drafter.dpace_alpha == t->drafter.dpace_alpha);
    T_ASSERT(t2.drafter.keep_checkpoints == t->drafter.keep_checkpoints &&
             t2.drafter.max_checkpoint_failures == t->drafter.max_checkpoint_failures &&
             t2.drafter.max_nonfinite_steps == t->drafter.max_nonfinite_steps &&
             t2.drafter.allreduce_bucket_kb == t->drafter.allreduce_bucket_kb);
    T_ASSERT(t2.drafter.layer_types_given == t->drafter.layer_types_given &&
             t2.drafter.sliding_window == t->drafter.sliding_window &&
             memcmp(t2.drafter.layer_sliding, t->drafter.layer_sliding, sizeof t->drafter.layer_sliding) == 0);
    json_decref(j1);
    json_decref(j2);
    free(text);
    topology_free(&t2);
}

static void test_valid(void)
{
    topo t;
    char err[512];
    int rc = topology_load(&t, "tests/topologies/good/minimal.json", err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    T_ASSERT(rc == 0 && err[0] == '\0');
    check_minimal_defaults(&t);
    check_round_trip(&t);
    json_t *j = topology_to_json(&t);
    T_ASSERT(json_integer_value(json_object_get(json_object_get(j, "drafter"), "block_size")) == 16);
    T_ASSERT(json_is_null(json_object_get(json_object_get(j, "drafter"), "mask_token_id")));
    T_ASSERT(json_is_null(json_object_get(json_object_get(j, "drafter"), "layer_types")));
    T_ASSERT(json_is_null(json_object_get(json_object_get(j, "drafter"), "sliding_window")));
    T_ASSERT(t.description == NULL && json_is_null(json_object_get(j, "description")));
    json_decref(j);
    topology_free(&t);
    T_ASSERT(is_zeroed(&t));
    topology_free(&t); /* twice is fine */

    rc = topology_load(&t, "tests/topologies/good/full.json", err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    T_ASSERT(rc == 0);
    check_full(&t);
    check_round_trip(&t);
    topology_free(&t);

    char *doc = q(VALID);
    T_ASSERT_RC(topology_parse(&t, doc, NULL, err, sizeof err));
    T_ASSERT(t.source_path == NULL && t.n_workers == 3 && t.workers[2].in_ring == 1);
    topology_free(&t);
    free(doc);
    printf("ok: minimal (defaults) and full topologies parsed field by field, JSON round trip\n");
}

/* drafter.layer_types / sliding_window accepted: absent or null (no kinds given: all full,
 * or an init_dir release's), all full given explicitly, a mix with its window; each kept,
 * written back in the normalised JSON and read again the same. */
static void test_attention_kinds(void)
{
    static const struct {
        const char *drafter;
        int given;
        uint8_t sliding[3];
        uint32_t window;
        const char *json_types, *json_window; /* the normalised values, compact */
    } cases[] = {
        {"'num_layers':3", 0, {0, 0, 0}, 0, "null", "null"},
        {"'num_layers':3,'layer_types':null,'sliding_window':null", 0, {0, 0, 0}, 0, "null", "null"},
        {"'num_layers':3,'layer_types':['full_attention','full_attention','full_attention']",
         1,
         {0, 0, 0},
         0,
         "[\"full_attention\",\"full_attention\",\"full_attention\"]",
         "null"},
        {"'num_layers':3,'layer_types':['sliding_attention','full_attention','sliding_attention'],'sliding_window':8",
         1,
         {1, 0, 1},
         8,
         "[\"sliding_attention\",\"full_attention\",\"sliding_attention\"]",
         "8"},
        {"'num_layers':3,'sliding_window':1,'layer_types':['full_attention','full_attention','sliding_attention']",
         1,
         {0, 0, 1},
         1,
         "[\"full_attention\",\"full_attention\",\"sliding_attention\"]",
         "1"},
    };
    for (size_t i = 0; i < DF_ARRAY_LEN(cases); i++) {
        char doc[2048];
        snprintf(doc, sizeof doc, DOC(HEAD ",'drafter':{%s}," RINGS "," WORKERS), cases[i].drafter);
        char *text = q(doc);
        topo t;
        char err[512];
        int rc = topology_parse(&t, text, "t", err, sizeof err);
        if (rc)
            fprintf(stderr, "case %zu: %s\n", i, err);
        T_ASSERT(rc == 0);
        const topology_drafter *d = &t.drafter;
        T_ASSERT(d->num_layers == 3 && d->layer_types_given == cases[i].given && d->sliding_window == cases[i].window);
        for (int l = 0; l < TOPOLOGY_MAX_DRAFTER_LAYERS; l++)
            T_ASSERT(d->layer_sliding[l] == (l < 3 ? cases[i].sliding[l] : 0));
        json_t *j = topology_to_json(&t);
        T_ASSERT(j);
        json_t *jd = json_object_get(j, "drafter");
        char *types = json_dumps(json_object_get(jd, "layer_types"), JSON_ENCODE_ANY | JSON_COMPACT);
        char *window = json_dumps(json_object_get(jd, "sliding_window"), JSON_ENCODE_ANY | JSON_COMPACT);
        T_ASSERT(types && window);
        T_ASSERT_STREQ(types, cases[i].json_types);
        T_ASSERT_STREQ(window, cases[i].json_window);
        free(types);
        free(window);
        json_decref(j);
        check_round_trip(&t);
        topology_free(&t);
        free(text);
    }
    printf("ok: drafter.layer_types / sliding_window: absent, null, all full, mixed with a window; kept and written "
           "back\n");
}

/* description: free text, kept and written back verbatim; longer than 1024 characters is refused. */
static void test_description(void)
{
    const char *text = "benchmark: random weights, not a training recipe (\"quoted\", ü)";
    char *doc = q(VALID);
    json_t *root = json_loads(doc, 0, NULL);
    T_ASSERT(root);
    free(doc);
    T_ASSERT(json_object_set_new(root, "description", json_string(text)) == 0);
    char *s = json_dumps(root, 0);
    T_ASSERT(s);
    topo t;
    char err[512];
    T_ASSERT_RC(topology_parse(&t, s, "t", err, sizeof err));
    T_ASSERT_STREQ(t.description, text);
    json_t *j = topology_to_json(&t);
    T_ASSERT(j && json_is_string(json_object_get(j, "description")));
    T_ASSERT_STREQ(json_string_value(json_object_get(j, "description")), text);
    /* the key sits right after "name" in the normalised file */
    const char *prev = NULL, *key;
    void *it = json_object_iter(j);
    for (; it; it = json_object_iter_next(j, it)) {
        key = json_object_iter_key(it);
        if (strcmp(key, "description") == 0)
            break;
        prev = key;
    }
    T_ASSERT(prev && strcmp(prev, "name") == 0);
    json_decref(j);
    check_round_trip(&t);
    topology_free(&t);
    free(s);

    char big[1100];
    memset(big, 'x', sizeof big - 1);
    big[1024] = '\0';
    T_ASSERT(json_object_set_new(root, "description", json_string(big)) == 0);
    T_ASSERT((s = json_dumps(root, 0)) != NULL);
    T_ASSERT_RC(topology_parse(&t, s, "t", err, sizeof err)); /* 1024: the limit itself */
    topology_free(&t);
    free(s);
    big[1024] = 'x';
    big[1025] = '\0';
    T_ASSERT(json_object_set_new(root, "description", json_string(big)) == 0);
    T_ASSERT((s = json_dumps(root, 0)) != NULL);
    T_ASSERT(topology_parse(&t, s, "t", err, sizeof err) == -EINVAL);
    T_ASSERT_STREQ(err, "t: description: expected at most 1024 characters, got 1025");
    T_ASSERT(is_zeroed(&t));
    free(s);
    json_decref(root);
    printf("ok: description kept verbatim, written after name, round trip; 1025 characters refused\n");
}

static void test_tiny_config(void)
{
    topo t;
    char err[512];
    int rc = topology_load(&t, "configs/tiny.json", err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    T_ASSERT(rc == 0);
    T_ASSERT_STREQ(t.name, "tiny");
    T_ASSERT_STREQ(t.run_dir, "run/tiny");
    T_ASSERT(t.backend == TOPOLOGY_CPU && t.deterministic == 1 && t.seed == 1234);
    T_ASSERT_STREQ(t.target_model_dir, "models/tiny-target");
    T_ASSERT(t.n_capture == 2 && t.capture_layers[0] == 1 && t.capture_layers[1] == 3);
    T_ASSERT(t.n_shards == 1);
    T_ASSERT_STREQ(t.shards[0], "data/tiny/train2400-000.dfs");
    /* the demo's drafter (docs/drafter_quality.md): 2 sliding layers of window 4, D-PACE 0.5 */
    T_ASSERT(t.drafter.num_layers == 2 && t.drafter.sliding_window == 4 && t.drafter.layer_sliding[0] == 1 &&
             t.drafter.layer_sliding[1] == 1);
    T_ASSERT(t.drafter.loss == TOPOLOGY_LOSS_DPACE && t.drafter.dpace_alpha == 0.5);
    T_ASSERT(t.n_rings == 2 && t.n_workers == 4 && topology_n_drafters(&t) == 1);
    T_ASSERT(topology_find_validator(&t) == 3 && t.workers[3].role == TOPOLOGY_ROLE_VALIDATOR &&
             t.workers[3].gpu == -1);
    T_ASSERT(t.val.enabled && t.val.n_shards == 1 && t.val.max_samples == 32 && t.val.every_steps == 100);
    T_ASSERT_STREQ(t.val.shards[0], "data/tiny/heldout-000.dfs");
    T_ASSERT(topology_find_worker(&t, "postproc0") == 1);
    check_round_trip(&t);
    topology_free(&t);
    printf("ok: configs/tiny.json loads\n");
}

/* The validator's gpu: optional with backend "cuda" (absent or -1: the CPU), kept and written
 * back when given. */
static void test_gpu_validator(void)
{
    static const struct {
        const char *w;
        int gpu;
    } cases[] = {{"{'name':'v','role':'validator','gpu':1}", 1},
                 {"{'name':'v','role':'validator'}", -1},
                 {"{'name':'v','role':'validator','gpu':-1}", -1}};
    for (size_t i = 0; i < DF_ARRAY_LEN(cases); i++) {
        char doc[2048];
        snprintf(doc, sizeof doc, DOC(CUDA_PIPE("%s") "," VAL("'every_steps':0")), cases[i].w);
        char *text = q(doc);
        topo t;
        char err[512];
        int rc = topology_parse(&t, text, "t", err, sizeof err);
        if (rc)
            fprintf(stderr, "%s\n", err);
        T_ASSERT(rc == 0);
        int v = topology_find_validator(&t);
        T_ASSERT(v == 3 && t.workers[v].gpu == cases[i].gpu);
        check_round_trip(&t);
        topology_free(&t);
        free(text);
    }
    printf("ok: a validator's gpu with backend \"cuda\": a device, absent or -1 (the CPU)\n");
}

/* topology_free on structs filled by hand, the way a half-done parse leaves them. */
static void test_free_partial(void)
{
    topo t;
    memset(&t, 0, sizeof t);
    topology_free(&t);
    topology_free(NULL);

    t.run_dir = strdup("r");
    t.n_shards = 3;
    t.shards = calloc(3, sizeof(char *));
    T_ASSERT(t.run_dir && t.shards);
    t.shards[0] = strdup("a"); /* [1], [2] never filled */
    t.n_workers = 4;
    t.workers = calloc(4, sizeof(topology_worker));
    T_ASSERT(t.workers);
    t.workers[0].env = calloc(2, sizeof(char *));
    T_ASSERT(t.workers[0].env);
    t.workers[0].env[0] = strdup("A=1");
    t.workers[1].args = calloc(1, sizeof(char *)); /* empty vector; env NULL */
    t.capture_layers = calloc(2, sizeof(int));
    topology_free(&t);
    T_ASSERT(is_zeroed(&t));
    printf("ok: topology_free on zeroed and half-filled structs\n");
}

int main(void)
{
    test_bad_cases();
    test_missing_file();
    test_valid();
    test_tiny_config();
    test_gpu_validator();
    test_attention_kinds();
    test_description();
    test_free_partial();
    printf("test_topology: all passed\n");
    return 0;
}
