//! The library's error type, and `context` on results and options that
//! wraps an error in what was being done (read as a chain, outermost first).

/// What went wrong in a check, with what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory operation.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// `cargo metadata`'s output.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A number in an access string that does not parse.
    #[error(transparent)]
    Number(#[from] std::num::ParseIntError),
    /// An offset in a file that does not fit this machine's `usize`.
    #[error(transparent)]
    Range(#[from] std::num::TryFromIntError),
    /// An ELF, BTF or .BTF.ext blob that does not parse.
    #[error("{0}")]
    Format(String),
    /// An external tool (clang, apt, dpkg-deb, a decompressor) failed.
    #[error("{0}")]
    Tool(String),
    /// Something the check needs is not there (a package, a file, a type).
    #[error("{0}")]
    Missing(String),
    /// `source`, while doing `what`.
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<Error>,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Returns early with an [`Error`] of the given kind and a formatted message.
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::Error::$kind(format!($($arg)*)))
    };
}
pub(crate) use bail;

/// Adds what was being done to an error; a `None` becomes [`Error::Missing`].
pub(crate) trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T>;
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|e| Error::Context {
            what: what.into(),
            source: Box::new(e.into()),
        })
    }

    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| Error::Context {
            what: what().into(),
            source: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.ok_or_else(|| Error::Missing(what.into()))
    }

    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.ok_or_else(|| Error::Missing(what().into()))
    }
}
