"""`mlptrain svm`: every number of the report equals scikit-learn's, computed here directly on the same
arrays (part of a tiny autoencoder's real features, so that the fits take a fraction of a second)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn.metrics import confusion_matrix
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC

from mlptrain.probe.features import extract_features, load_features
from mlptrain.probe.svm import parse_c_values, svm_report


def direct_fit(x, y, c, standardize=True, max_iter=1000):
    """(predict, converged) of the documented recipe: StandardScaler on train, LinearSVC one-vs-rest."""
    scaler = StandardScaler().fit(x) if standardize else None

    def scaled(a):
        return scaler.transform(a) if scaler is not None else a

    svm = LinearSVC(C=c, dual="auto", max_iter=max_iter, random_state=0).fit(scaled(x), y)
    return lambda a: svm.predict(scaled(a))


@pytest.fixture(scope="module")
def features_path(tiny_runs, tmp_path_factory):
    """The first 1,500 train and 400 test rows of the tiny autoencoder's latent features."""
    f = extract_features(tiny_runs["ae"]).features
    path = tmp_path_factory.mktemp("svm") / "features.npz"
    np.savez(path, train_x=f.train_x[:1500], train_y=f.train_y[:1500], test_x=f.test_x[:400],
             test_y=f.test_y[:400], run=np.array(f.run), layer=np.array(f.layer))
    return path


def test_svm_json_matches_a_direct_scikit_learn_fit(features_path):
    result = subprocess.run([sys.executable, "-m", "mlptrain", "svm", str(features_path), "--C", "0.01"],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    for title in ("test accuracy", "per-class test accuracy", "confusion matrix"):
        assert title in result.stderr
    report = json.loads((features_path.parent / "features.svm.json").read_text())
    f = load_features(features_path)
    predict = direct_fit(f.train_x, f.train_y, 0.01)
    predicted = predict(f.test_x)
    assert report["test_acc"] == np.mean(predicted == f.test_y)
    assert report["train_acc"] == np.mean(predict(f.train_x) == f.train_y)
    assert report["classes"] == list(range(10)) and report["class_names"] is None  # the file has none
    assert report["per_class_acc"] == [np.mean(predicted[f.test_y == k] == k) for k in range(10)]
    assert report["confusion_matrix"] == confusion_matrix(f.test_y, predicted).tolist()
    assert (report["C"], report["C_selection"], report["feature_dim"], report["standardize"]) == (0.01, None, 256, True)
    assert (report["train_size"], report["test_size"], report["run"], report["layer"]) == (1500, 400, "ae", "latent")
    assert report["fit_s"] > 0 and report["converged"] and report["warnings"] == []


def test_no_standardize_fits_the_features_as_they_are(features_path):
    f = load_features(features_path)
    report = svm_report(f, features_path, [0.001], standardize=False)
    predict = direct_fit(f.train_x, f.train_y, 0.001, standardize=False)
    assert report["test_acc"] == np.mean(predict(f.test_x) == f.test_y) and not report["standardize"]


def test_several_c_values_pick_the_best_on_held_out_training_features(features_path):
    f = load_features(features_path)
    cs = [1e-4, 1e-2, 1.0]
    report = svm_report(f, features_path, cs, max_iter=2000)
    fit_rows, val_rows = train_test_split(np.arange(1500), test_size=0.2, stratify=f.train_y, random_state=0)
    assert len(val_rows) == 300 and np.bincount(f.train_y[val_rows]).min() > 0  # stratified
    accuracies = []
    for c in cs:
        predict = direct_fit(f.train_x[fit_rows], f.train_y[fit_rows], c, max_iter=2000)
        accuracies.append(np.mean(predict(f.train_x[val_rows]) == f.train_y[val_rows]))
    assert len(set(accuracies)) > 1  # so the choice means something
    assert [r["C"] for r in report["C_selection"]] == cs
    assert [r["val_acc"] for r in report["C_selection"]] == accuracies
    assert report["C"] == cs[int(np.argmax(accuracies))] and report["held_out_fraction"] == 0.2
    predict = direct_fit(f.train_x, f.train_y, report["C"], max_iter=2000)  # refitted on all training features
    assert report["test_acc"] == np.mean(predict(f.test_x) == f.test_y)


def test_non_convergence_is_one_warning_line(features_path, tmp_path):
    out = tmp_path / "report.json"
    result = subprocess.run([sys.executable, "-m", "mlptrain", "svm", str(features_path), "--C", "10",
                             "--max-iter", "1", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "ConvergenceWarning" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "did not converge" in warnings[0] and "--max-iter 1 " in warnings[0]
    assert json.loads(out.read_text())["converged"] is False


def test_c_values_parse_sorted_without_duplicates():
    assert parse_c_values("0.1, 1e-3,0.1") == [0.001, 0.1]


def test_report_names_the_classes_of_the_features_file(rng):
    from mlptrain.probe.features import FeatureSet

    x, y = rng.normal(size=(30, 4)), np.arange(30) % 3
    features = FeatureSet(x, y, x[:9], np.array([0, 2] * 4 + [0]), "run", "latent", ("ant", "bee", "cow"))
    report = svm_report(features, None, [1.0])
    assert report["classes"] == [0, 1, 2] and report["class_names"] == ["ant", "bee", "cow"]
