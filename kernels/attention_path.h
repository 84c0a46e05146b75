// kernels/attention_path.h: which attention the network runs, for the CPU reference
// (kernels/cpu/attention_naive.h, attention_tiled.h) and the GPU (kernels/attention.cuh) alike.
//   Naive  S = Q K^T, P = softmax(S) stored (B, NH, T, T), O = dropout(P) V
//   Flash  the same O in tiles, keeping only each row's logsumexp for the backward
#pragma once

enum class AttentionPath { Naive, Flash };
