"""What the notebook registered with libraries, as sent to a target process."""

from transformers import AutoConfig, PretrainedConfig

from neuron_workbench.run.library_state import notebook_registrations


def _registered_configs():
    return {
        key: value
        for (module, name, _), entries in notebook_registrations().items()
        if name == "CONFIG_MAPPING"
        for key, value in entries.items()
    }


def test_a_checkpoints_own_classes_stay_out_of_what_is_sent():
    # from_pretrained(..., trust_remote_code=True) registers classes of transformers_modules.<hash>,
    # which a worker that never loaded the checkpoint cannot import: sent with every request, the
    # request failed to load there, each cell after
    class NotebookConfig(PretrainedConfig):
        model_type = "notebook-kind"

    class RemoteConfig(PretrainedConfig):
        model_type = "remote-kind"

    RemoteConfig.__module__ = "transformers_modules.abc123.configuration_remote"
    AutoConfig.register("notebook-kind", NotebookConfig)
    AutoConfig.register("remote-kind", RemoteConfig)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        sent = _registered_configs()
        assert sent.get("notebook-kind") is NotebookConfig
        assert "remote-kind" not in sent
    finally:
        CONFIG_MAPPING._extra_content.pop("notebook-kind", None)
        CONFIG_MAPPING._extra_content.pop("remote-kind", None)
