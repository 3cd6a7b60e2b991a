"""`mlptrain svm`: a linear SVM on a features file, the standard test of how linearly separable a
representation makes the classes.

scikit-learn's LinearSVC (liblinear: squared hinge loss, L2 penalty, one-vs-rest over the classes) on
`train_*`, evaluated on `test_*`. By default every feature is standardised with the mean and standard
deviation of the training features (StandardScaler fitted on train only). With several C values, each is
fitted on a stratified 80% of the training features and scored on the other 20% (fixed seed); the best
(the smallest C among ties) is then refitted on all of them.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlptrain.config.safe_yaml import brief_text
from mlptrain.errors import UserError
from mlptrain.probe.features import FeatureSet
from mlptrain.util.console import console

SEED = 0  # the held-out split and liblinear's coordinate order
HELD_OUT = 0.2
C_RANGE = (1e-9, 1e9)  # beyond it liblinear's coordinate descent runs on without an answer
LARGE = 1e100  # features beyond this overflow a variance (x**2); they are scaled by their peak first
WAIT_S = 0.1  # how often the waiting thread looks at the fit: Ctrl-C acts within this


def parse_c_values(text: str) -> list[float]:
    """'0.001,0.01,0.1' -> [0.001, 0.01, 0.1] (sorted, duplicates dropped); raises UserError."""
    values = set()
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise UserError(f"--C {brief_text(text)}: '{brief_text(part.strip())}' is not a number; give positive values such as "
                            "--C 0.001,0.01,0.1") from None
        if not (math.isfinite(value) and C_RANGE[0] <= value <= C_RANGE[1]):
            raise UserError(f"--C {brief_text(text)}: {brief_text(part.strip())} is outside [{C_RANGE[0]:g}, "
                            f"{C_RANGE[1]:g}], where liblinear's solver answers (standardised features want "
                            "0.00001 to 1)")
        values.add(value)
    return sorted(values)


@dataclass
class Fit:
    scaler: object  # a fitted StandardScaler, or None
    svm: object  # a fitted LinearSVC
    seconds: float
    converged: bool
    prescale: float = 1.0  # multiplies the features before the scaler (1 / their peak when that is huge)

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = x * self.prescale if self.prescale != 1.0 else x
        return self.svm.predict(self.scaler.transform(x) if self.scaler is not None else x)


def prescale_for(x: np.ndarray, standardize: bool) -> float:
    """1, or 1 / the features' peak when squaring them would overflow: standardising x / peak gives
    the same features as standardising x, without the overflow. Unstandardised, such features are refused."""
    peak = max(float(x.max()), -float(x.min())) if x.size else 0.0  # max |x| without an |x| copy of the features
    if peak <= LARGE:
        return 1.0
    if not standardize:
        raise UserError(f"features reach {peak:.3g}; liblinear overflows beyond about {LARGE:g}: drop "
                        "--no-standardize (standardising rescales them) or rescale the features")
    return 1.0 / peak


def fit_svm(x: np.ndarray, y: np.ndarray, c: float, standardize: bool, max_iter: int) -> Fit:
    """Scaler (fitted on `x` only) and LinearSVC; `converged` is False when liblinear stopped at max_iter."""
    # scikit-learn is slow to import: only when an SVM is fitted
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import LinearSVC

    t0 = time.perf_counter()
    prescale = prescale_for(x, standardize)
    x = x * prescale if prescale != 1.0 else x
    scaler = StandardScaler().fit(x) if standardize else None
    # dual='auto' (scikit-learn >= 1.3, the pinned floor): the primal when samples outnumber features
    svm = LinearSVC(C=c, dual="auto", max_iter=max_iter, random_state=SEED)
    console.print(f"fitting LinearSVC, C {c:g}, on {len(y):,} x {x.shape[1]:,} features"
                  f"{' (standardised)' if standardize else ''}, at most {max_iter:,} iterations", highlight=False,
                  soft_wrap=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        _fit_in_a_thread(svm, scaler.transform(x) if scaler is not None else x, y)
    for w in caught:  # only the convergence warning becomes our own one line; the rest pass through
        if not issubclass(w.category, ConvergenceWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return Fit(scaler, svm, time.perf_counter() - t0, converged, prescale)


def _fit_in_a_thread(svm, x: np.ndarray, y: np.ndarray) -> None:
    """`svm.fit` in a thread of its own while this one waits in short joins: liblinear runs in C and answers no
    signal until it returns (Ctrl-C took 53 s to act on 60,000 x 512 features), but it releases the
    interpreter, so Ctrl-C now reaches this thread at once and the process ends without waiting for the fit
    (the thread is a daemon). A terminal shows the seconds spent meanwhile."""
    failed = []

    def fit():
        try:
            svm.fit(x, y)
        except BaseException as err:  # raised again in the waiting thread
            failed.append(err)

    thread = threading.Thread(target=fit, name="svm-fit", daemon=True)
    started = time.perf_counter()
    thread.start()
    with console.status("fitting") as status:
        while thread.is_alive():
            thread.join(WAIT_S)
            status.update(f"fitting: {time.perf_counter() - started:.0f} s")
    if failed:
        raise failed[0]


def held_out_accuracies(x: np.ndarray, y: np.ndarray, cs: list[float], standardize: bool,
                        max_iter: int) -> list[dict]:
    """{C, val_acc, converged} for each C: fitted on a stratified (1 - HELD_OUT) of (x, y), scored on the rest."""
    # scikit-learn is slow to import: only when an SVM is fitted
    from sklearn.model_selection import train_test_split

    try:
        fit_rows, val_rows = train_test_split(np.arange(len(y)), test_size=HELD_OUT, stratify=y, random_state=SEED)
    except ValueError as err:
        raise UserError(f"--C with several values holds out {HELD_OUT:.0%} of the training features, stratified "
                        f"by class, and cannot here: {err}") from None
    results = []
    for c in cs:
        fit = fit_svm(x[fit_rows], y[fit_rows], c, standardize, max_iter)
        accuracy = float(np.mean(fit.predict(x[val_rows]) == y[val_rows]))
        results.append({"C": c, "val_acc": accuracy, "converged": fit.converged})
    return results


def svm_report(features: FeatureSet, path: Path, cs: list[float], standardize: bool = True,
               max_iter: int = 1000) -> dict:
    """Fit (choosing C on held-out training features when several are given), evaluate, and return what
    the report file holds. Raises UserError."""
    # scikit-learn is slow to import: only when an SVM is fitted
    from sklearn.metrics import confusion_matrix

    try:
        prescale_for(features.train_x, standardize)  # refuses features too large to fit unstandardised
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    if len(np.unique(features.train_y)) < 2:
        raise UserError(f"{path}: train_y holds a single class; a classifier needs at least two")
    selection = None
    if len(cs) > 1:
        selection = held_out_accuracies(features.train_x, features.train_y, cs, standardize, max_iter)
        c = max(selection, key=lambda r: r["val_acc"])["C"]  # max keeps the first, so the smallest C, on ties
    else:
        c = cs[0]
    fit = fit_svm(features.train_x, features.train_y, c, standardize, max_iter)
    train_acc = float(np.mean(fit.predict(features.train_x) == features.train_y))
    predicted = fit.predict(features.test_x)
    classes = np.union1d(features.train_y, features.test_y)
    matrix = confusion_matrix(features.test_y, predicted, labels=classes)
    per_class = [float(matrix[i, i] / matrix[i].sum()) if matrix[i].sum() else None for i in range(len(classes))]
    notes = [f"LinearSVC did not converge in --max-iter {max_iter} iterations for C={r['C']:g} (held-out fit)"
             for r in selection or [] if not r["converged"]]
    if not fit.converged:
        notes.append(f"LinearSVC did not converge in --max-iter {max_iter} iterations for C={c:g}; raise "
                     "--max-iter or lower C")
    return {
        "features": str(path), "run": features.run, "layer": features.layer,
        "feature_dim": int(features.train_x.shape[1]), "train_size": len(features.train_y),
        "test_size": len(features.test_y), "standardize": standardize, "max_iter": max_iter,
        "C": c, "C_selection": selection, "held_out_fraction": HELD_OUT if selection else None, "seed": SEED,
        "test_acc": float(np.mean(predicted == features.test_y)), "train_acc": train_acc,
        "classes": [int(k) for k in classes], "class_names": _names(features.class_names, classes),
        "per_class_acc": per_class, "confusion_matrix": matrix.tolist(),
        "fit_s": fit.seconds, "converged": fit.converged, "warnings": notes,
    }


def _names(class_names: tuple[str, ...], classes: np.ndarray) -> list[str] | None:
    """The dataset's name of each class present, or None for a features file without names."""
    if not class_names:
        return None
    return [class_names[k] if 0 <= k < len(class_names) else str(k) for k in classes]
