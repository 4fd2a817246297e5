/* eval_prompts.h: the prompts of an evaluation (prefix prompts_), from chat JSONL or from
 * prepared token shards (.dfs), as token lists ready for the target.
 *
 * A prompt is a conversation up to its first assistant turn, rendered the way the model
 * was trained to continue it:
 *   - shard sample: its tokens before the first loss-mask-1 token (prepare_data.py puts
 *     loss 1 on assistant tokens only, so this ends with the assistant marker);
 *   - chat JSONL line (OpenAI "messages" or ShareGPT "conversations"): the messages before
 *     the first assistant one, tokenized like scripts/prepare_data.py does with a
 *     byte_tokenizer.json ([bos] then [user] + latin-1 bytes per message, then [assistant];
 *     characters above U+00FF become '?'). Other tokenizers have no C implementation here:
 *     prepare the prompts with scripts/prepare_data.py and pass the shard.
 * So a JSONL file and the shard prepare_data.py made from it give the same prompts.
 *
 * Errors name the file and the line (JSONL) or the sample (shards). Ownership: prompts_list
 * owns every prompt; prompts_free releases them. */
#ifndef DF_EVAL_PROMPTS_H
#define DF_EVAL_PROMPTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct prompts_entry {
    int32_t *tokens;
    int n;
    char source[320]; /* "file:line" or "file#sample" */
} prompts_entry;

typedef struct prompts_list {
    prompts_entry *p;
    int n, cap;
} prompts_list;

/* Append up to max_total prompts (over the whole list) from path: .dfs is a shard, any
 * other name chat JSONL (which needs tokenizer_dir/byte_tokenizer.json). Prompts longer
 * than max_len keep their LAST max_len tokens (the end carries the assistant marker).
 * Every token must be < vocab. 0 or -errno (-EINVAL: bad content, err names file and
 * line/sample/field). */
int prompts_load(prompts_list *l, const char *path, const char *tokenizer_dir, int vocab, int max_total, int max_len,
                 char *err, size_t errlen);
void prompts_free(prompts_list *l);

/* The eos token of a byte_tokenizer.json in dir, or -1 when there is none. */
int prompts_byte_tokenizer_eos(const char *dir);

#endif
