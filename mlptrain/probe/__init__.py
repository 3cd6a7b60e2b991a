"""Probing a trained model's representation: its features over a dataset (`features`), and a linear
SVM on them (`svm`)."""
