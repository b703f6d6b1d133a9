"""Models, losses and the flat-vector SGD step: the training math every engine shares."""
