/* Fine-tune a CNN imported from PyTorch, from C: the exported training step, no Python.
 *
 *   python examples/finetune/prepare.py build     # exports build/finetune.{o,h}, writes build/finetune_data.bin
 *   cc -std=c99 -O2 -I build -o build/finetune examples/finetune/finetune.c build/finetune.o -lm
 *   build/finetune build/finetune_data.bin [STEPS]
 *
 * finetune_data.bin: int32 steps, batch, channels, height, width, float32 learning rate; then each step's batch
 * (float32 images, int64 labels), then a test batch. Runs STEPS steps (default: all in the
 * file), printing each loss, then the accuracy on the test batch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "finetune.h"

#define BATCH FINETUNE_STEP_X_DIM0

static void read_all(FILE *f, void *p, size_t bytes) {
    if (fread(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "finetune_data.bin is too short\n");
        exit(2);
    }
}

int main(int argc, char **argv) {
    FILE *f = fopen(argc > 1 ? argv[1] : "finetune_data.bin", "rb");
    if (!f) {
        perror("finetune_data.bin");
        return 2;
    }
    int32_t head[5];
    read_all(f, head, sizeof head);
    float lr;
    read_all(f, &lr, sizeof lr);
    long pixels = (long)head[2] * head[3] * head[4];
    if (head[1] != BATCH || pixels * BATCH != FINETUNE_STEP_X_SIZE) {
        fprintf(stderr, "the data's batches (%d x %ld values) are not the exported step's (%d x %d)\n", head[1],
                pixels, BATCH, FINETUNE_STEP_X_SIZE / BATCH);
        return 2;
    }
    int steps = head[0];
    if (argc > 2 && atoi(argv[2]) >= 0 && atoi(argv[2]) < steps) steps = atoi(argv[2]);
    float *x = malloc(sizeof(float) * FINETUNE_STEP_X_SIZE);
    int64_t *y = malloc(sizeof(int64_t) * BATCH);

    /* two state blobs used in turn: a step reads one and writes the other (the frozen
     * convolution is copied along, batch norm's statistics updated) */
    void *state[2] = {malloc(FINETUNE_STEP_STATE_IN_BYTES), malloc(FINETUNE_STEP_STATE_IN_BYTES)};
    memcpy(state[0], finetune_initial_state, FINETUNE_STEP_STATE_IN_BYTES);
    int current = 0;
    for (int s = 0; s < head[0]; s++) {
        read_all(f, x, sizeof(float) * FINETUNE_STEP_X_SIZE);
        read_all(f, y, sizeof(int64_t) * BATCH);
        if (s >= steps) continue;   /* skip to the test batch */
        float loss, accuracy;
        /* seed: a new value each step; lr: the step's learning rate; t: the step count from 1 */
        int rc = finetune_step(x, y, s + 1, lr, (float)(s + 1), state[current], state[1 - current], &loss,
                               &accuracy);
        if (rc != FINETUNE_OK) {
            fprintf(stderr, "step %d failed with code %d\n", s + 1, rc);
            return 1;
        }
        current = 1 - current;
        printf("step %d loss %.6f\n", s + 1, loss);
    }
    read_all(f, x, sizeof(float) * FINETUNE_STEP_X_SIZE);
    read_all(f, y, sizeof(int64_t) * BATCH);
    fclose(f);
    const int64_t *tracked = (const int64_t *)((const char *)state[current] +
                                               FINETUNE_STEP_STATE_IN_BN1_NUM_BATCHES_TRACKED_OFFSET);
    float logits[FINETUNE_PREDICT_OUT_SIZE];
    int rc = finetune_predict(x, state[current], logits);
    if (rc != FINETUNE_OK) {
        fprintf(stderr, "predict failed with code %d\n", rc);
        return 1;
    }
    int correct = 0;
    for (int i = 0; i < BATCH; i++) {
        int best = 0;
        for (int c = 1; c < FINETUNE_PREDICT_OUT_DIM1; c++)
            if (logits[i * FINETUNE_PREDICT_OUT_DIM1 + c] > logits[i * FINETUNE_PREDICT_OUT_DIM1 + best]) best = c;
        correct += best == y[i];
    }
    printf("batch norm saw %lld batches; test accuracy %.4f on %d images\n", (long long)*tracked,
           (double)correct / BATCH, BATCH);
    return 0;
}
