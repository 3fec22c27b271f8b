// Conversations for supervised fine-tuning: a JSONL line {"messages": [{"role", "content"},
// ...]} (TRL's and torchtune's conversational format) rendered by the tokenizer's chat template
// (tokenizer_config.json's `chat_template`, or chat_template.jinja beside it; data/jinja.h) as
// transformers' apply_chat_template renders it, and the parts of the text the loss trains on:
// the assistant's turns.
//
// An assistant turn is found as Hugging Face finds it. A template with {% generation %} blocks
// (return_assistant_tokens_mask, TRL's assistant_only_loss) marks it itself. Otherwise turn i
// begins where the conversation before it, rendered with add_generation_prompt, ends (that
// rendering must be a prefix of the whole conversation's) and ends after the tokenizer's
// eos_token (an instruct model's end of turn: Llama 3's <|eot_id|>, Qwen3's <|im_end|>) or,
// where the template never writes that token there, where the conversation up to and
// including turn i, rendered alone, ends.
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "data/jinja.h"

typedef struct {
    char *text;  // the rendered conversation (malloc'd)
    size_t len;
    size_t *start, *end;  // (n) the trained byte ranges of text, ascending and disjoint
    int n;
} ChatExample;

// Renders the conversation `line` (a JSONL object) with the variables apply_chat_template
// passes: specials (the tokenizer's special tokens, tokenizer_chat_template), its "messages",
// its "tools" (else None), documents None, add_generation_prompt false, and the members of its
// "chat_template_kwargs" (TRL's column; e.g. enable_thinking). False with a one-line reason in
// err (a template error, a conversation without an assistant turn, turns the rule above cannot
// find).
bool chat_render(const Jinja *tmpl, const json_t *specials, const json_t *line,
                 ChatExample *out, char *err, size_t errlen);
void chat_example_free(ChatExample *e);
// The conversation `line` rendered as chat_render renders it but with add_generation_prompt:
// what a model continues with the assistant's reply (`titan generate --chat`). The malloc'd
// text (*len bytes), or NULL with a one-line reason in err.
char *chat_render_prompt(const Jinja *tmpl, const json_t *specials, const json_t *line,
                         size_t *len, char *err, size_t errlen);
