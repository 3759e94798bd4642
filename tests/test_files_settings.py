"""The COMPANION_* settings of stored files: read from the environment, bad values refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from errors import ConfigurationError
from runtime.config import Settings


def test_file_settings_defaults_and_overrides(tmp_path):
    defaults = Settings.from_env({"COMPANION_DATA_DIR": str(tmp_path)})
    assert defaults.files_path == tmp_path / "files"
    assert (defaults.max_file_bytes, defaults.inline_file_chars) == (50 * 1024 * 1024, 20_000)
    assert (defaults.file_read_pages, defaults.file_read_chars, defaults.file_read_wait, defaults.zip_depth) == (
        8,
        28_000,
        3.0,
        2,
    )
    custom = Settings.from_env(
        {
            "COMPANION_FILES_DIR": str(tmp_path / "blobs"),
            "COMPANION_MAX_FILE_BYTES": "1000",
            "COMPANION_INLINE_FILE_CHARS": "500",
            "COMPANION_FILE_READ_PAGES": "3",
            "COMPANION_FILE_READ_CHARS": "9000",
            "COMPANION_FILE_READ_WAIT": "0.5",
            "COMPANION_ZIP_DEPTH": "1",
        }
    )
    assert custom.files_path == Path(tmp_path / "blobs")
    assert (custom.max_file_bytes, custom.inline_file_chars, custom.file_read_pages) == (1000, 500, 3)
    assert (custom.file_read_chars, custom.file_read_wait, custom.zip_depth) == (9000, 0.5, 1)


@pytest.mark.parametrize(
    "var, value",
    [
        pytest.param("COMPANION_MAX_FILE_BYTES", "0", id="no-bytes"),
        pytest.param("COMPANION_MAX_FILE_BYTES", "lots", id="not-a-number"),
        pytest.param("COMPANION_FILE_READ_PAGES", "0", id="no-pages"),
        pytest.param("COMPANION_FILE_READ_CHARS", "50", id="too-few-chars"),
        pytest.param("COMPANION_FILE_READ_WAIT", "-1", id="negative-wait"),
        pytest.param("COMPANION_FILE_READ_WAIT", "3600", id="hour-long-wait"),
        pytest.param("COMPANION_ZIP_DEPTH", "0", id="no-zip"),
    ],
)
def test_bad_file_settings_name_the_variable(var, value):
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({var: value})
    assert info.value.setting == var and var in str(info.value)


def test_blob_store_settings_default_to_postgres_and_s3_needs_a_bucket():
    assert Settings.from_env({}).blob_store == "postgres"
    s3 = Settings.from_env(
        {
            "COMPANION_BLOB_STORE": "S3",
            "COMPANION_S3_BUCKET": "companion-files",
            "COMPANION_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
            "COMPANION_S3_ACCESS_KEY_ID": "AKIDEXAMPLE",
            "COMPANION_S3_SECRET_ACCESS_KEY": "very-secret-value",
            "COMPANION_S3_PREFIX": "companion/",
        }
    )
    assert (s3.blob_store, s3.s3_bucket, s3.s3_prefix) == ("s3", "companion-files", "companion/")
    assert s3.s3_secret_access_key is not None and s3.s3_secret_access_key.get_secret_value() == "very-secret-value"
    assert "very-secret-value" not in repr(s3)
    for env, setting in (
        ({"COMPANION_BLOB_STORE": "s3"}, "COMPANION_S3_BUCKET"),
        ({"COMPANION_BLOB_STORE": "disk"}, "COMPANION_BLOB_STORE"),
    ):
        with pytest.raises(ConfigurationError) as info:
            Settings.from_env(env)
        assert info.value.setting == setting and setting in str(info.value)
