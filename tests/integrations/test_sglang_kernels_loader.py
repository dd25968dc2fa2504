"""`load_extend_attention` on stand-in sglang trees (no GPU): the normal import when it works, the
kernel files with the package ``__init__``s skipped when it does not, whether the failed import
left ``sglang`` behind (a trimmed copy without ``__init__`` files) or not (a full wheel whose
``__init__`` raises), and a clear error when neither way works."""

from __future__ import annotations

import sys

import pytest

from kdtree.integrations.sglang.sglang_kernels import load_extend_attention

KERNEL = '''
from sglang.srt.utils import is_cuda
from sglang.srt.environ import envs


def extend_attention_fwd():
    return ("kernel", envs)
'''


def _tree(root, *, init=None, kernel=KERNEL):
    attention = root / "sglang" / "kernels" / "ops" / "attention"
    attention.mkdir(parents=True)
    (attention / "extend_attention.py").write_text(kernel)
    (root / "sglang" / "srt").mkdir()
    (root / "sglang" / "srt" / "environ.py").write_text("envs = 'environ'\n")
    if init is not None:
        (root / "sglang" / "__init__.py").write_text(init)
    return root


@pytest.fixture
def on_path(monkeypatch):
    def put(root):
        monkeypatch.syspath_prepend(str(root))
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    yield put
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]


def test_a_trimmed_copy_without_init_files_loads_the_kernel_file(tmp_path, on_path):
    on_path(_tree(tmp_path))
    fn, how = load_extend_attention()
    assert fn() == ("kernel", "environ")
    assert "package __init__s skipped" in how and "sglang.srt.utils" in how


def test_a_wheel_whose_init_fails_loads_the_kernel_file(tmp_path, on_path):
    on_path(_tree(tmp_path, init="raise ImportError('zmq is missing')\n"))
    fn, how = load_extend_attention()
    assert fn() == ("kernel", "environ") and "zmq is missing" in how


def test_the_normal_import_is_used_when_it_works(tmp_path, on_path):
    root = _tree(tmp_path, init="")
    (root / "sglang" / "srt" / "utils.py").write_text("def is_cuda():\n    return False\n")
    on_path(root)
    fn, how = load_extend_attention()
    assert fn() == ("kernel", "environ") and how.startswith("import sglang")


def test_a_broken_kernel_file_names_both_failures(tmp_path, on_path):
    on_path(_tree(tmp_path, kernel="raise RuntimeError('broken kernel file')\n"))
    with pytest.raises(ImportError, match="broken kernel file"):
        load_extend_attention()
    assert not [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]
