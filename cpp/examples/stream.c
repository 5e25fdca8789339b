/* Streaming from C: decode with SPOT and print each block's ids the moment the block is final.
 *
 *   spot_stream MODEL_DIR PROMPT_IDS [STOP_AFTER_BLOCKS]
 *   spot_stream emb_onnx 12,7,301,9 1      # one line of ids per finished block; stop after the first
 *
 * Plain C99 against include/spot/spot.h (it also keeps the header C-compatible: CMake builds this as C). The
 * drafter is the folder's own (drafter.onnx beside the manifest); without one, the `tree` decoder is used. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spot/spot.h"

typedef struct {
  long stop_after, blocks;
} stream_state;

/* Called by spot_generate_stream after each finished block; nonzero ends generation after it. */
static int on_block(const int64_t* ids, size_t n_ids, void* user) {
  stream_state* state = (stream_state*)user;
  for (size_t i = 0; i < n_ids; ++i) printf(i ? " %" PRId64 : "%" PRId64, ids[i]);
  printf("\n");
  fflush(stdout);
  state->blocks += 1;
  return state->stop_after > 0 && state->blocks >= state->stop_after;
}

/* A whole decimal integer in [lo, hi], or -1 (and a message) when `text` is not one. */
static int parse_integer(const char* what, const char* text, long long lo, long long hi, long long* out) {
  char* end = NULL;
  errno = 0;
  long long x = strtoll(text, &end, 10);
  if (*text == '\0' || *end != '\0' || errno == ERANGE || x < lo || x > hi) {
    fprintf(stderr, "spot_stream: %s expects an integer in [%lld, %lld], got '%s'\n", what, lo, hi, text);
    return -1;
  }
  *out = x;
  return 0;
}

static const char* kUsage = "usage: spot_stream MODEL_DIR PROMPT_IDS [STOP_AFTER_BLOCKS]\n"
                            "  PROMPT_IDS: comma-separated token ids; STOP_AFTER_BLOCKS: >= 0 (0: to the end)\n";

int main(int argc, char** argv) {
  if (spot_abi_version() != SPOT_ABI_VERSION) { /* a libspot built from another header: its structs differ */
    fprintf(stderr, "spot_stream: libspot has binary interface %d, this program was built for %d\n",
            spot_abi_version(), SPOT_ABI_VERSION);
    return 4;
  }
  if (argc < 3 || argc > 4) {
    fputs(kUsage, stderr);
    return 64;
  }
  long long stop_after = 0;
  if (argc > 3 && parse_integer("STOP_AFTER_BLOCKS", argv[3], 0, LONG_MAX, &stop_after) != 0) return 64;
  /* ids: every comma-separated item an integer (the library checks the vocabulary range) */
  size_t n_prompt = 0, len = strlen(argv[2]);
  int64_t* prompt = malloc((len / 2 + 1) * sizeof *prompt);
  for (const char* item = argv[2]; len > 0;) {
    const char* comma = strchr(item, ',');
    size_t n = comma ? (size_t)(comma - item) : strlen(item);
    char buf[32];
    long long id = 0;
    if (n == 0 || n >= sizeof buf) {
      fprintf(stderr, "spot_stream: PROMPT_IDS expects comma-separated integers, got '%s'\n", argv[2]);
      free(prompt);
      return 64;
    }
    memcpy(buf, item, n);
    buf[n] = '\0';
    if (parse_integer("a prompt id", buf, INT64_MIN, INT64_MAX, &id) != 0) {
      free(prompt);
      return 64;
    }
    prompt[n_prompt++] = id;
    if (comma == NULL) break;
    item = comma + 1;
    if (*item == '\0') {    /* a trailing comma */
      fprintf(stderr, "spot_stream: PROMPT_IDS expects comma-separated integers, got '%s'\n", argv[2]);
      free(prompt);
      return 64;
    }
  }

  spot_error err;
  spot_model* model = NULL;
  if (spot_open(argv[1], NULL, &model, &err) != SPOT_OK) {
    fprintf(stderr, "spot_stream: %s\n", err.message);
    free(prompt);
    return err.code;
  }
  spot_model_info info;
  spot_model_get_info(model, &info, &err);
  spot_generate_options go;
  spot_generate_options_init(&go);
  go.decoder = info.has_drafter ? SPOT_DECODER_SPOT : SPOT_DECODER_TREE;
  go.temperature = 1.0;
  go.seed = 1;
  go.max_new_tokens = 48;

  size_t cap = spot_output_capacity(model, n_prompt, go.max_new_tokens), n = 0;
  int64_t* out = malloc((cap > 0 ? cap : 1) * sizeof *out);   /* 0: a request spot_generate refuses (its error) */
  stream_state state = {(long)stop_after, 0};
  spot_stats stats;
  spot_status st = spot_generate_stream(model, prompt, n_prompt, &go, on_block, &state, out, cap, &n, &stats, &err);
  if (st != SPOT_OK) fprintf(stderr, "spot_stream: %s\n", err.message);
  else
    fprintf(stderr, "%zu ids in %" PRId64 " blocks, %" PRId64 " target passes%s\n", n, stats.blocks,
            stats.target_passes, stats.stopped == 2 ? ", stopped by the callback" : "");
  free(out);
  free(prompt);
  spot_close(model);
  return (int)st;
}
