/* The C unit tests build their layers by hand: the board header's model is empty. */
#ifndef TN_MODEL_H
#define TN_MODEL_H
#endif
