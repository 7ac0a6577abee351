#pragma once
// Everything in optim/: SGD, AdamW, parameter groups, the warmup-cosine schedule and grad clipping.
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "optim/param_groups.h"
#include "optim/sgd.h"
