//! Typed indexes: an upstream, a model route, a route's target. Each is a
//! position in one list that the config fixes at load time; a distinct
//! type per list means one cannot be used for another, and none has a
//! placeholder value (a thing either has one or is `None`).

use std::fmt;

macro_rules! id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u32);

        impl $name {
            /// The id of the item at `index` in its list (lists are
            /// bounded well below `u32::MAX` by the config's validation).
            pub const fn at(index: usize) -> Self {
                Self(index as u32)
            }

            /// Its position in its list.
            pub const fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($what, "#{}"), self.0)
            }
        }
    };
}

id!(
    /// An upstream: its place in the config's `upstreams`, in the gateway's
    /// live upstreams, and in the name list of the journal and metrics.
    UpstreamId,
    "upstream"
);
id!(
    /// A model route (alias or pattern): its place in the config's `models`.
    RouteId,
    "route"
);
id!(
    /// A target of one route: its place in that route's `targets`.
    TargetId,
    "target"
);

/// Items of one list, indexed by its own id type only.
#[derive(Debug, Clone)]
pub struct Table<I, T> {
    items: Vec<T>,
    id: std::marker::PhantomData<fn(I)>,
}

impl<I, T> Default for Table<I, T> {
    fn default() -> Self {
        Self { items: Vec::new(), id: std::marker::PhantomData }
    }
}

impl<I: Into<usize> + Copy, T> Table<I, T> {
    /// The item with this id.
    pub fn get(&self, id: I) -> Option<&T> {
        self.items.get(id.into())
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// All of them, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }
}

impl<I, T> From<Vec<T>> for Table<I, T> {
    fn from(items: Vec<T>) -> Self {
        Self { items, id: std::marker::PhantomData }
    }
}

impl<I: Into<usize> + Copy, T> std::ops::Index<I> for Table<I, T> {
    type Output = T;

    /// Ids come from the same config as the table, so every id names an
    /// item; indexing by one cannot be out of bounds.
    fn index(&self, id: I) -> &T {
        &self.items[id.into()]
    }
}

impl<'a, I, T> IntoIterator for &'a Table<I, T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl From<UpstreamId> for usize {
    fn from(id: UpstreamId) -> usize {
        id.index()
    }
}

impl From<RouteId> for usize {
    fn from(id: RouteId) -> usize {
        id.index()
    }
}

impl From<TargetId> for usize {
    fn from(id: TargetId) -> usize {
        id.index()
    }
}
