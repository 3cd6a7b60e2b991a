"""A classifier's confusion matrix at each evaluation, as the image TensorBoard shows (`confusion/val`,
`confusion/test`): a row per true class, a column per predicted class, each cell shaded by the share of
its row (so a class with few images reads as plainly as one with many), with its count written in where
the cell is large enough to hold it."""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np

WHITE, BLUE = np.array([255, 255, 255]), np.array([33, 90, 180])  # a share of 0 and of 1
MAX_SIDE = 300  # pixels across the whole matrix: 10 classes get 30-pixel cells, 100 get 3
CELL_LIMITS = (2, 30)
GRID_CELL = 6  # the smallest cell that gets grid lines (finer ones would be all grid)
COUNT_CELL = 26  # the smallest cell a count is written in
LABEL_CELL = 14  # the smallest cell whose row and column get their class number
LABEL_INK, DARK_INK, LIGHT_INK = np.array([90, 90, 90]), np.array([40, 40, 40]), np.array([255, 255, 255])
_FONT_IN_USE = threading.Lock()


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    """(classes, classes) counts: [true, predicted]; rows whose label is outside [0, classes) are left out."""
    labels, predicted = labels.astype(np.int64), predicted.astype(np.int64)
    keep = (labels >= 0) & (labels < classes) & (predicted >= 0) & (predicted < classes)
    flat = labels[keep] * classes + predicted[keep]
    return np.bincount(flat, minlength=classes * classes).reshape(classes, classes)


class OutcomeCounts:
    """confusion_matrix of a split's rows from the loss kernel's outcomes (1 for a hit, else -1 - the predicted
    class), the labels' part done once: a split is counted at every epoch's end, and each NumPy call there is
    one more wait for the interpreter for a packed sweep's feeding thread while its other threads write (12
    calls took 0.7-1.4 ms a matrix on the GPU machine's host, 8 took 0.5 ms: benchmarks/NOTES.md, issue 30 step
    22)."""

    def __init__(self, labels: np.ndarray, classes: int):
        self.labels, self.classes = np.asarray(labels).astype(np.int64), classes
        self.offsets = self.labels * classes  # the first cell of each row's true class
        self.in_range = bool(((self.labels >= 0) & (self.labels < classes)).all())

    def matrix(self, outcomes: np.ndarray) -> np.ndarray:
        """(classes, classes) counts, those of confusion_matrix(labels, predicted, classes)."""
        predicted = np.where(outcomes == 1, self.labels, -1 - outcomes.astype(np.int64))
        c = self.classes
        if self.in_range and predicted.size and predicted.min() >= 0 and predicted.max() < c:
            return np.bincount(self.offsets + predicted, minlength=c * c).reshape(c, c)
        return confusion_matrix(self.labels, predicted, self.classes)


def confusion_image(matrix: np.ndarray) -> np.ndarray:
    """The matrix drawn as an (H, W, 3) uint8 image, class numbers along the top and left."""
    classes = len(matrix)
    cell = int(np.clip(MAX_SIDE // max(classes, 1), *CELL_LIMITS))
    margin = 2 * cell // 3 if cell >= LABEL_CELL else 0
    rows = matrix.sum(axis=1, keepdims=True)
    share = np.divide(matrix, rows, out=np.zeros(matrix.shape), where=rows > 0)
    colours = (WHITE + share[..., None] * (BLUE - WHITE)).round().astype(np.uint8)
    cells = np.repeat(np.repeat(colours, cell, axis=0), cell, axis=1)
    picture = np.full((margin + classes * cell, margin + classes * cell, 3), 255, np.uint8)
    picture[margin:, margin:] = cells
    if cell >= GRID_CELL:
        picture[margin:, margin::cell] = picture[margin::cell, margin:] = 200  # grid lines between the cells
    if margin:
        texts = []
        for k in range(classes):
            middle = margin + k * cell + cell // 2
            texts += [(str(k), middle, margin // 2, LABEL_INK), (str(k), margin // 2, middle, LABEL_INK)]
        if cell >= COUNT_CELL:
            for (t, p), count in np.ndenumerate(matrix):
                texts.append((_short(int(count)), margin + p * cell + cell // 2, margin + t * cell + cell // 2,
                              LIGHT_INK if share[t, p] > 0.5 else DARK_INK))
        _write(picture, texts)
    return picture


def _write(picture: np.ndarray, texts: list) -> None:
    """Each (text, x, y, ink) of `texts` centred on (x, y), blended in by its coverage, all in one pass over the
    pixels they ink: a blend per text (~10 NumPy calls on a small box, 120 texts for 10 classes) took ~4.5 ms a
    matrix on the GPU machine, on a logger thread holding the interpreter that a packed sweep's training loop
    waits for. No two texts ink one pixel (a text to a cell or margin slot), and a pixel a text's box leaves
    uninked blends to itself, so the picture is that of a blend per text."""
    dys, dxs, covers, ys, xs, inks = [], [], [], [], [], []
    for text, x, y, ink in texts:
        dy, dx, cover, top, left = _inked(text)
        dys.append(dy), dxs.append(dx), covers.append(cover)
        ys.append(y + top), xs.append(x + left), inks.append(ink)
    counts = [len(dy) for dy in dys]
    rows = np.concatenate(dys) + np.repeat(ys, counts)
    cols = np.concatenate(dxs) + np.repeat(xs, counts)
    inside = (rows >= 0) & (rows < picture.shape[0]) & (cols >= 0) & (cols < picture.shape[1])  # clipped at its edges
    rows, cols = rows[inside], cols[inside]
    cover = np.concatenate(covers)[inside][:, None]
    ink = np.repeat(np.array(inks), counts, axis=0)[inside]
    picture[rows, cols] = (picture[rows, cols] * (1 - cover) + ink * cover).round().astype(np.uint8)


@lru_cache(maxsize=4096)
def _inked(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """The pixels `text` inks (_rendered's coverage above 0): their rows and columns in its box, their coverage
    (float32), and the box's offset from the text's centre (top, left)."""
    coverage, left, top = _rendered(text)
    dy, dx = np.nonzero(coverage > 0)
    return dy, dx, coverage[dy, dx], top, left


@lru_cache(maxsize=256)
def _rendered(text: str) -> tuple[np.ndarray, int, int]:
    """`text` in Pillow's default font as coverage in [0, 1], with its box's offset from the centre: a
    count recurs from one evaluation to the next, and rendering is most of a matrix's drawing."""
    from PIL import Image, ImageDraw  # only runs that log a classifier's evaluations draw

    font = _font()
    with _FONT_IN_USE:  # one FreeType face, and the runs of a sweep draw on threads of their own
        left, top, right, bottom = font.getbbox(text, anchor="mm")
        mask = Image.new("L", (max(right - left, 1), max(bottom - top, 1)), 0)
        ImageDraw.Draw(mask).text((-left, -top), text, fill=255, font=font, anchor="mm")
    return np.asarray(mask, np.float32) / 255.0, left, top


@lru_cache(maxsize=1)
def _font():
    """Pillow's default font, loaded once: loading it decodes the font afresh (a tenth of a text's rendering)."""
    from PIL import ImageFont  # only runs that log a classifier's evaluations draw

    return ImageFont.load_default()


def _short(count: int) -> str:
    """A count in at most four characters: 987, 9.9k, 12k."""
    if count < 1000:
        return str(count)
    return f"{count / 1000:.1f}k" if count < 10_000 else f"{count // 1000}k"
