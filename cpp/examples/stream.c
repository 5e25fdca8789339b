/* Streaming from C: decode with SPOT and print each block's ids the moment the block is final.
 *
 *   spot_stream MODEL_DIR PROMPT_IDS [STOP_AFTER_BLOCKS]
 *   spot_stream emb_onnx 12,7,301,9 3      # one line of ids per finished block; stop after 3 blocks
 *
 * Plain C99 against include/spot/spot.h (it also keeps the header C-compatible: CMake builds this as C). The
 * drafter is the folder's own (drafter.onnx beside the manifest); without one, the `tree` decoder is used. */
#include <inttypes.h>
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

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: spot_stream MODEL_DIR PROMPT_IDS [STOP_AFTER_BLOCKS]\n");
    return 64;
  }
  size_t n_prompt = 0;
  int64_t* prompt = malloc((strlen(argv[2]) / 2 + 1) * sizeof *prompt);
  for (char* tok = strtok(argv[2], ","); tok != NULL; tok = strtok(NULL, ",")) prompt[n_prompt++] = atoll(tok);

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
  int64_t* out = malloc(cap * sizeof *out);
  stream_state state = {argc > 3 ? atol(argv[3]) : 0, 0};
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
