"""A trained run outside training: its model loaded from a checkpoint, evaluate and predict reports, the images
predict reads."""
