"""sites.is_user_file: which frames of a traceback are the user's code."""

import os
import sysconfig
import tempfile

import torch

import neuron_workbench
from neuron_workbench.sites import is_user_file


def test_cells_scripts_and_project_files_are_the_users():
    assert is_user_file("<ipython-input-3-0123abcd>")
    assert is_user_file("<neuron-cell-12>")
    # ipykernel's cell files, a script or a module of the project
    assert is_user_file(os.path.join(tempfile.gettempdir(), "ipykernel_42", "3395539720.py"))
    assert is_user_file("/home/me/project/models.py")


def test_libraries_and_generated_code_are_not():
    assert not is_user_file(torch.__file__)
    assert not is_user_file(neuron_workbench.__file__)
    assert not is_user_file(os.path.join(sysconfig.get_paths()["purelib"], "transformers", "x.py"))
    assert not is_user_file(os.__file__)
    # torch.compile's generated code: an FX graph's, Inductor's cache
    assert not is_user_file("<eval_with_key>.3")
    assert not is_user_file("<string>")
    assert not is_user_file(
        os.path.join(tempfile.gettempdir(), "torchinductor_root", "ab", "cabxyz.py")
    )
