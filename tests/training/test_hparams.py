"""The HParams dashboard as TensorBoard builds it from mlptrain's sessions: one run each, the varied
hyperparameters first, metric columns from the runs' own scalars (no hparam/* charts)."""

from mlptrain.config.load import config_from_dict
from mlptrain.training.hparams import hparam_values, write_session


def dashboard(logdir):
    """(hparam (name, differs) in the table's order, metric tags, runs) as TensorBoard 2.x computes them."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import backend_context

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    hparams = backend_context.Context(base_plugin.TBContext(data_provider=provider, logdir=str(logdir),
                                                            multiplexer=multiplexer))
    request = context.RequestContext()
    experiment = hparams.experiment_from_metadata(request, "", True, hparams.hparams_metadata(request, ""),
                                                  hparams.hparams_from_data_provider(request, "", None))
    return ([(h.name, h.differs) for h in experiment.hparam_infos], [m.name.tag for m in experiment.metric_infos],
            sorted(multiplexer.Runs()))


def test_a_sweeps_varied_keys_lead_and_each_run_appears_once(tmp_path):
    from tensorboardX import SummaryWriter

    from mlptrain.run_dirs.event_files import EventFile

    for i, (lr, hidden) in enumerate([(1e-3, [16]), (1e-2, [16]), (1e-2, [32])]):
        config = config_from_dict({"optim": {"lr": lr}, "model": {"hidden": hidden}})
        with SummaryWriter(str(tmp_path / f"trial-{i}")) as writer:
            writer.add_scalar("val/acc", 0.9, 1)
            writer.add_scalar("train/loss", 0.3, 1)
        events = EventFile(tmp_path / f"trial-{i}", ".session")  # the run's own: a second file of its folder
        write_session(events, hparam_values(config, backend="cpu", data_root="/data"))
        events.close()
    infos, metrics, runs = dashboard(tmp_path)
    assert runs == ["trial-0", "trial-1", "trial-2"]  # no trial-0/hparams beside each run
    assert [name for name, differs in infos if differs] == ["model.hidden", "optim.lr"]
    assert [name for name, _ in infos[:2]] == ["model.hidden", "optim.lr"]  # before every constant one
    assert "model.channels" not in dict(infos) and "description" not in dict(infos)  # not an MLP's key
    assert dict(infos)["backend"] is False  # recorded as used (cpu), the same in every run
    assert sorted(metrics) == ["train/loss", "val/acc"] and not any(m.startswith("hparam/") for m in metrics)


def test_the_values_are_the_config_as_run():
    values = hparam_values(config_from_dict({"model": {"type": "conv_autoencoder"}}), backend="cpu", data_root="/d")
    assert values["backend"] == "cpu" and values["data.root"] == "/d" and values["model.channels"] == "[256, 128]"
    assert "model.hidden" not in values and values["train.effective_batch_size"] == "128"
    assert values["data.path"] == ""  # unset: a blank cell in the dashboard, not "None"
    # whole numbers as text (the dashboard writes numbers to five digits: 128.00); others numbers, booleans as such
    assert values["seed"] == "0" and values["train.batch_size"] == "128" and values["train.epochs"] == "10"
    assert values["optim.lr"] == 1e-3 and values["train.cuda_graphs"] is True
