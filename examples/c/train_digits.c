/* Train te_grad's digits CNN for an epoch from C: the exported training step, no Python.
 *
 *   python examples/c/prepare.py build            # exports build/digits.{o,h}, writes build/digits_data.bin
 *   cc -std=c99 -O2 -I build -o build/train_digits examples/c/train_digits.c build/digits.o -lm
 *   build/train_digits build/digits_data.bin
 *
 * digits_data.bin: int32 n_batches, n_test; then each batch (64 images of 1x8x8 float32, 64 int64
 * labels), then the test images and labels. Prints the loss of every step and the test accuracy.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "digits.h"

#define BATCH DIGITS_STEP_X_DIM0
#define PIXELS (DIGITS_STEP_X_SIZE / BATCH)

static void read_all(FILE *f, void *p, size_t bytes) {
    if (fread(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "digits_data.bin is too short\n");
        exit(2);
    }
}

int main(int argc, char **argv) {
    FILE *f = fopen(argc > 1 ? argv[1] : "digits_data.bin", "rb");
    if (!f) {
        perror("digits_data.bin");
        return 2;
    }
    int32_t counts[2];
    read_all(f, counts, sizeof counts);
    int n_batches = counts[0], n_test = counts[1];
    float *x = malloc(sizeof(float) * DIGITS_STEP_X_SIZE * n_batches);
    int64_t *y = malloc(sizeof(int64_t) * BATCH * n_batches);
    float *x_test = malloc(sizeof(float) * PIXELS * n_test);
    int64_t *y_test = malloc(sizeof(int64_t) * n_test);
    for (int b = 0; b < n_batches; b++) {
        read_all(f, x + (size_t)b * DIGITS_STEP_X_SIZE, sizeof(float) * DIGITS_STEP_X_SIZE);
        read_all(f, y + (size_t)b * BATCH, sizeof(int64_t) * BATCH);
    }
    read_all(f, x_test, sizeof(float) * PIXELS * n_test);
    read_all(f, y_test, sizeof(int64_t) * n_test);
    fclose(f);

    /* two state blobs used in turn: a step reads one and writes the other */
    void *state[2] = {malloc(DIGITS_STEP_STATE_IN_BYTES), malloc(DIGITS_STEP_STATE_IN_BYTES)};
    memcpy(state[0], digits_initial_state, DIGITS_STEP_STATE_IN_BYTES);
    int current = 0;
    for (int b = 0; b < n_batches; b++) {
        float loss, accuracy;
        int rc = digits_step(x + (size_t)b * DIGITS_STEP_X_SIZE, y + (size_t)b * BATCH, b + 1, 0.01f,
                             (float)(b + 1), state[current], state[1 - current], &loss, &accuracy);
        if (rc != DIGITS_OK) {
            fprintf(stderr, "step %d failed with code %d\n", b + 1, rc);
            return 1;
        }
        current = 1 - current;
        printf("step %d loss %.6f\n", b + 1, loss);
    }
    /* test accuracy, BATCH images at a time */
    int correct = 0, seen = 0;
    float logits[DIGITS_PREDICT_OUT_SIZE];
    for (int at = 0; at + BATCH <= n_test; at += BATCH) {
        int rc = digits_predict(x_test + (size_t)at * PIXELS, state[current], logits);
        if (rc != DIGITS_OK) {
            fprintf(stderr, "predict failed with code %d\n", rc);
            return 1;
        }
        for (int i = 0; i < BATCH; i++) {
            int best = 0;
            for (int c = 1; c < DIGITS_PREDICT_OUT_DIM1; c++)
                if (logits[i * DIGITS_PREDICT_OUT_DIM1 + c] > logits[i * DIGITS_PREDICT_OUT_DIM1 + best]) best = c;
            correct += best == y_test[at + i];
            seen++;
        }
    }
    printf("test accuracy %.4f on %d images\n", (double)correct / seen, seen);
    return 0;
}
