//! Output files written atomically, never over their own input.
//!
//! Every subcommand that writes a file goes through [`OutputFile`]:
//!
//! * the output must not be one of the inputs (same device and inode, so a symlink or a hard link
//!   to the input is caught too): `compress -i x -o x` would otherwise truncate the data it is
//!   about to read, or replace it with something else;
//! * the bytes go to a temporary file in the output's directory, which is renamed over the output
//!   only once everything is written and synced: a failed write (full disk, bad stream, Ctrl-C
//!   before the rename) leaves the previous output, or none, and never a truncated one;
//! * an output that exists and is not a regular file (`/dev/null`, a FIFO) is written in place:
//!   renaming over it would replace the device node.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use zcomm::{Error, Result};

/// An output being written; [`OutputFile::commit`] makes it visible, dropping it discards it.
pub struct OutputFile {
    /// The path the user named (for messages).
    shown: PathBuf,
    /// Where the finished file goes (symlinks resolved: the link keeps pointing at the result).
    target: PathBuf,
    /// The temporary file, or `None` when writing in place to a non-regular file.
    tmp: Option<PathBuf>,
    w: BufWriter<File>,
}

impl OutputFile {
    /// Start writing `path`, refusing it when it is the same file as one of `inputs`.
    pub fn create(path: &Path, inputs: &[&Path]) -> Result<Self> {
        refuse_same_file(path, inputs)?;
        let meta = std::fs::metadata(path).ok();
        if meta.as_ref().is_some_and(|m| !m.is_file()) {
            let f = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| write_error(path, e))?;
            return Ok(OutputFile {
                shown: path.to_path_buf(),
                target: path.to_path_buf(),
                tmp: None,
                w: BufWriter::new(f),
            });
        }
        // an existing symlink: replace its target, not the link
        let target = if meta.is_some() {
            std::fs::canonicalize(path).map_err(|e| write_error(path, e))?
        } else {
            path.to_path_buf()
        };
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target
            .file_name()
            .ok_or_else(|| {
                Error::invalid(format!("output `{}` is not a file name", path.display()))
            })?
            .to_string_lossy()
            .into_owned();
        // unique among concurrent zcomm processes (pid) and outputs of this one (counter)
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.zcomm-{}-{seq}.tmp", std::process::id()));
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| write_error(path, e))?;
        if let Some(m) = &meta {
            // keep the mode of the file being replaced; best effort (the data matters more)
            let _ = f.set_permissions(m.permissions());
        }
        Ok(OutputFile {
            shown: path.to_path_buf(),
            target,
            tmp: Some(tmp),
            w: BufWriter::new(f),
        })
    }

    /// Append `bytes`.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.w
            .write_all(bytes)
            .map_err(|e| write_error(&self.shown, e))
    }

    /// Flush, sync and move the file into place.
    pub fn commit(mut self) -> Result<()> {
        self.w.flush().map_err(|e| write_error(&self.shown, e))?;
        let Some(tmp) = self.tmp.take() else {
            return Ok(());
        };
        let synced = self.w.get_ref().sync_all();
        let renamed = synced.and_then(|()| std::fs::rename(&tmp, &self.target));
        if let Err(e) = renamed {
            let _ = std::fs::remove_file(&tmp);
            return Err(write_error(&self.shown, e));
        }
        Ok(())
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        // not committed: the partial file must not survive
        if let Some(tmp) = self.tmp.take() {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// Write `bytes` to `path` atomically (see the module doc).
pub fn write_all(path: &Path, bytes: &[u8], inputs: &[&Path]) -> Result<()> {
    let mut f = OutputFile::create(path, inputs)?;
    f.write(bytes)?;
    f.commit()
}

fn write_error(path: &Path, e: std::io::Error) -> Error {
    Error::invalid(format!("cannot write output `{}`: {e}", path.display()))
}

/// Refuse an output that already exists as the same file (device and inode) as an input.
fn refuse_same_file(out: &Path, inputs: &[&Path]) -> Result<()> {
    let Some(o) = file_id(out) else {
        return Ok(());
    };
    for i in inputs {
        if file_id(i).as_ref() == Some(&o) {
            return Err(Error::invalid(format!(
                "output `{}` is the input `{}`: writing it would destroy the input (choose another output)",
                out.display(),
                i.display()
            )));
        }
    }
    Ok(())
}

/// Device and inode of the file `p` names (after symlinks), where it exists.
#[cfg(unix)]
fn file_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Elsewhere: the canonical path stands in for the file's identity.
#[cfg(not(unix))]
fn file_id(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p).ok()
}
