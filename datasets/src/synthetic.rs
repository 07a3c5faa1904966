//! A seeded synthetic multi-hop world: fictional people, cities, countries, universities and
//! structures linked by relations, one wiki-18-style passage per entity, and 1-, 2- and 3-hop
//! questions whose answers need that many searches.
//!
//! A passage states only its own entity's relations, so a k-hop question (`Who founded the
//! university attended by the designer of X?`) needs the passages of k entities along its chain.
//! The generator rejects chains whose answer already appears in the question or in an earlier
//! passage of the chain, so no hop can be skipped. The same seed gives the same world, byte for
//! byte, on every platform.

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::types::{Metric, Passage, QaExample};

/// Sizes of the world. Every entity gets one passage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorldConfig {
    pub seed: u64,
    pub countries: usize,
    pub cities: usize,
    pub people: usize,
    pub universities: usize,
    pub structures: usize,
}

impl Default for WorldConfig {
    fn default() -> Self {
        Self { seed: 0, countries: 6, cities: 30, people: 120, universities: 20, structures: 60 }
    }
}

impl WorldConfig {
    /// A world `factor` times the default size (at least the default).
    pub fn scaled(seed: u64, factor: usize) -> Self {
        let f = factor.max(1);
        let d = Self::default();
        Self {
            seed,
            countries: d.countries * f,
            cities: d.cities * f,
            people: d.people * f,
            universities: d.universities * f,
            structures: d.structures * f,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Country,
    City,
    Person,
    University,
    Structure,
}

/// Index into [`World::entities`].
pub type EntityId = usize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entity {
    pub id: EntityId,
    pub kind: Kind,
    pub name: String,
    /// Founding, birth or opening year.
    pub year: u32,
    /// Structure kind ("bridge", "lighthouse", ...) or the person's profession.
    pub descriptor: String,
    /// City for cities' countries, people's birthplace, universities' and structures' location.
    pub place: Option<EntityId>,
    /// A person's university.
    pub alma_mater: Option<EntityId>,
    /// A structure's designer or a university's founder.
    pub maker: Option<EntityId>,
}

/// A relation one hop follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// Structure -> person.
    Designer,
    /// University -> person.
    Founder,
    /// Person -> university.
    AlmaMater,
    /// Person -> city.
    Birthplace,
    /// Structure or university -> city.
    Location,
    /// City -> country.
    Country,
}

impl Relation {
    fn follow(self, e: &Entity) -> Option<EntityId> {
        match (self, e.kind) {
            (Relation::Designer, Kind::Structure) | (Relation::Founder, Kind::University) => e.maker,
            (Relation::AlmaMater, Kind::Person) => e.alma_mater,
            (Relation::Birthplace, Kind::Person)
            | (Relation::Location, Kind::Structure | Kind::University)
            | (Relation::Country, Kind::City) => e.place,
            _ => None,
        }
    }

    /// Relations that start from an entity of this kind.
    fn from_kind(kind: Kind) -> &'static [Relation] {
        match kind {
            Kind::Structure => &[Relation::Designer, Relation::Location],
            Kind::University => &[Relation::Founder, Relation::Location],
            Kind::Person => &[Relation::AlmaMater, Relation::Birthplace],
            Kind::City => &[Relation::Country],
            Kind::Country => &[],
        }
    }

    /// A noun phrase for "the <relation> of <inner>".
    fn noun_phrase(self, inner: &str) -> String {
        match self {
            Relation::Designer => format!("the designer of {inner}"),
            Relation::Founder => format!("the founder of {inner}"),
            Relation::AlmaMater => format!("the university attended by {inner}"),
            Relation::Birthplace => format!("the birthplace of {inner}"),
            Relation::Location => format!("the city where {inner} stands"),
            Relation::Country => format!("the country that {inner} belongs to"),
        }
    }

    /// The question asking for this relation of `subject`.
    fn question(self, subject: &str) -> String {
        match self {
            Relation::Designer => format!("Who designed {subject}?"),
            Relation::Founder => format!("Who founded {subject}?"),
            Relation::AlmaMater => format!("Which university did {subject} attend?"),
            Relation::Birthplace => format!("In which city was {subject} born?"),
            Relation::Location => format!("In which city is {subject} located?"),
            Relation::Country => format!("In which country is {subject}?"),
        }
    }
}

/// One generated question with the chain of entities that answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyntheticQuestion {
    pub example: QaExample,
    pub hops: usize,
    /// Entities whose passages must be read, in order; the answer is the entity after the last.
    pub chain: Vec<EntityId>,
    pub relations: Vec<Relation>,
    pub answer: EntityId,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct World {
    pub config: WorldConfig,
    pub entities: Vec<Entity>,
    /// One passage per entity; `passages[i]` describes `entities[i]`.
    pub passages: Vec<Passage>,
}

const ONSETS: [&str; 24] = [
    "b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "qu", "r", "s", "st", "t", "th", "tr",
    "v", "w", "z",
];
const VOWELS: [&str; 9] = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "y"];
const CODAS: [&str; 12] = ["", "n", "r", "l", "s", "th", "m", "nd", "rt", "ck", "x", "v"];
const CITY_SUFFIXES: [&str; 8] = ["mouth", "ford", "wick", "ton", "bury", "haven", "stead", "port"];
const STRUCTURES: [&str; 8] =
    ["bridge", "lighthouse", "tower", "library", "observatory", "canal", "aqueduct", "opera house"];
const PROFESSIONS: [&str; 6] = ["engineer", "architect", "industrialist", "physician", "astronomer", "merchant"];
const PERSON_FILLER: [&str; 4] = [
    "Letters by this person are kept in a private collection.",
    "A portrait of this person hangs in a provincial gallery.",
    "This person is remembered in several local histories.",
    "A street was later named after this person.",
];
const FILLER: [&str; 8] = [
    "It appears in several regional guidebooks.",
    "Local historians have written about it at length.",
    "It was renovated during the last century.",
    "Visitors often mention it in travel accounts.",
    "Its records are kept in the municipal archive.",
    "It is the subject of a well-known folk song.",
    "Several paintings depict it.",
    "It is listed among the region's landmarks.",
];

fn syllable(rng: &mut ChaCha8Rng) -> String {
    format!("{}{}{}", ONSETS.choose(rng).unwrap(), VOWELS.choose(rng).unwrap(), CODAS.choose(rng).unwrap())
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

fn word(rng: &mut ChaCha8Rng, syllables: usize) -> String {
    capitalised(&(0..syllables).map(|_| syllable(rng)).collect::<String>())
}

impl World {
    pub fn generate(config: &WorldConfig) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let mut used = std::collections::HashSet::new();
        let mut entities: Vec<Entity> = Vec::new();
        // Names are unique words, so a search for one finds its own passage.
        let mut unique = |rng: &mut ChaCha8Rng, make: &dyn Fn(&mut ChaCha8Rng) -> String| loop {
            let name = make(rng);
            if used.insert(name.to_lowercase()) {
                return name;
            }
        };
        let push = |entities: &mut Vec<Entity>, kind, name, year, descriptor: &str| {
            let id = entities.len();
            entities.push(Entity {
                id,
                kind,
                name,
                year,
                descriptor: descriptor.to_string(),
                place: None,
                alma_mater: None,
                maker: None,
            });
            id
        };
        let countries: Vec<_> = (0..config.countries.max(1))
            .map(|_| {
                let n = unique(&mut rng, &|r| format!("{}ia", word(r, 2)));
                let year = rng.random_range(900..1500);
                push(&mut entities, Kind::Country, n, year, "country")
            })
            .collect();
        let cities: Vec<_> = (0..config.cities.max(1))
            .map(|_| {
                let n = unique(&mut rng, &|r| format!("{}{}", word(r, 1), CITY_SUFFIXES.choose(r).unwrap()));
                let year = rng.random_range(1000..1700);
                push(&mut entities, Kind::City, n, year, "city")
            })
            .collect();
        let people: Vec<_> = (0..config.people.max(1))
            .map(|_| {
                let n = unique(&mut rng, &|r| format!("{} {}", word(r, 1), word(r, 2)));
                let year = rng.random_range(1780..1920);
                let profession = *PROFESSIONS.choose(&mut rng).unwrap();
                push(&mut entities, Kind::Person, n, year, profession)
            })
            .collect();
        let universities: Vec<_> = (0..config.universities.max(1))
            .map(|_| {
                let n = unique(&mut rng, &|r| {
                    if r.random_bool(0.5) {
                        format!("{} Institute of Technology", word(r, 2))
                    } else {
                        format!("{} College", word(r, 2))
                    }
                });
                let year = rng.random_range(1700..1900);
                push(&mut entities, Kind::University, n, year, "university")
            })
            .collect();
        let structures: Vec<_> = (0..config.structures.max(1))
            .map(|_| {
                let kind = *STRUCTURES.choose(&mut rng).unwrap();
                let title: Vec<String> = kind.split(' ').map(capitalised).collect();
                let n = unique(&mut rng, &|r| format!("{} {}", word(r, 2), title.join(" ")));
                let year = rng.random_range(1820..1990);
                push(&mut entities, Kind::Structure, n, year, kind)
            })
            .collect();
        for &c in &cities {
            entities[c].place = Some(*countries.choose(&mut rng).unwrap());
        }
        for &p in &people {
            entities[p].place = Some(*cities.choose(&mut rng).unwrap());
            entities[p].alma_mater = Some(*universities.choose(&mut rng).unwrap());
        }
        for &u in &universities {
            entities[u].place = Some(*cities.choose(&mut rng).unwrap());
            entities[u].maker = Some(*people.choose(&mut rng).unwrap());
        }
        for &s in &structures {
            entities[s].place = Some(*cities.choose(&mut rng).unwrap());
            entities[s].maker = Some(*people.choose(&mut rng).unwrap());
        }
        let passages = entities.iter().map(|e| passage(&entities, e, &mut rng)).collect();
        World { config: config.clone(), entities, passages }
    }

    fn name(&self, id: EntityId) -> &str {
        &self.entities[id].name
    }

    /// Up to `n` distinct questions of exactly `hops` hops (1 to 3), drawn with `seed`. Each is
    /// an EM-scored [`QaExample`] with data source `synthetic_<hops>hop`.
    pub fn questions(&self, hops: usize, n: usize, seed: u64) -> Vec<SyntheticQuestion> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (hops as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut starts: Vec<EntityId> = self
            .entities
            .iter()
            .filter(|e| matches!(e.kind, Kind::Structure | Kind::University | Kind::Person))
            .map(|e| e.id)
            .collect();
        starts.shuffle(&mut rng);
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for start in starts.into_iter().cycle().take(n.saturating_mul(20).max(64)) {
            if out.len() >= n {
                break;
            }
            let Some(q) = self.chain_from(start, hops, &mut rng) else { continue };
            if seen.insert(q.example.question.clone()) {
                out.push(q);
            }
        }
        for (i, q) in out.iter_mut().enumerate() {
            q.example.id = format!("synthetic-s{}-{hops}hop-{i}", self.config.seed);
        }
        out
    }

    /// Disjoint training and held-out question sets of `hops` hops: one pool of distinct
    /// questions drawn with `seed`, the first `n_test` held out, the next `n_train` for training.
    /// Ids carry the split (`synthetic-s<world>-<hops>hop-test-<i>` / `-train-<i>`).
    pub fn split_questions(
        &self,
        hops: usize,
        n_train: usize,
        n_test: usize,
        seed: u64,
    ) -> (Vec<SyntheticQuestion>, Vec<SyntheticQuestion>) {
        let mut pool = self.questions(hops, n_train.saturating_add(n_test), seed);
        let train = pool.split_off(n_test.min(pool.len()));
        let rename = |mut qs: Vec<SyntheticQuestion>, split: &str| {
            for (i, q) in qs.iter_mut().enumerate() {
                q.example.id = format!("synthetic-s{}-{hops}hop-{split}-{i}", self.config.seed);
                q.example.split = Some(split.to_string());
            }
            qs
        };
        (rename(train, "train"), rename(pool, "test"))
    }

    fn chain_from(&self, start: EntityId, hops: usize, rng: &mut ChaCha8Rng) -> Option<SyntheticQuestion> {
        if !(1..=3).contains(&hops) {
            return None;
        }
        let mut chain = vec![start];
        let mut relations = Vec::new();
        let mut current = start;
        for _ in 0..hops {
            let rel = *Relation::from_kind(self.entities[current].kind).choose(rng)?;
            let next = rel.follow(&self.entities[current])?;
            relations.push(rel);
            chain.push(next);
            current = next;
        }
        let answer = chain.pop()?;
        // Visiting an entity twice would let a later hop be read off an earlier passage.
        let mut ids = chain.clone();
        ids.push(answer);
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != hops + 1 {
            return None;
        }
        let mut subject = self.name(start).to_string();
        for rel in &relations[..hops - 1] {
            subject = rel.noun_phrase(&subject);
        }
        let question = relations[hops - 1].question(&subject);
        let answer_name = self.name(answer).to_lowercase();
        // No hop may be skipped: the answer must not be readable before the last passage.
        let leaks = question.to_lowercase().contains(&answer_name)
            || chain[..hops - 1].iter().any(|&e| self.passages[e].text.to_lowercase().contains(&answer_name));
        if leaks {
            return None;
        }
        let example = QaExample {
            id: String::new(),
            question,
            golden_answers: vec![self.name(answer).to_string()],
            data_source: format!("synthetic_{hops}hop"),
            split: None,
            metric: Some(Metric::Em),
            metadata: [
                ("hops".to_string(), serde_json::Value::from(hops)),
                (
                    "chain".to_string(),
                    serde_json::Value::from(chain.iter().map(|&e| self.name(e).to_string()).collect::<Vec<_>>()),
                ),
            ]
            .into_iter()
            .collect(),
        };
        Some(SyntheticQuestion { example, hops, chain, relations, answer })
    }
}

fn article(noun: &str) -> &'static str {
    if noun.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" }
}

fn passage(entities: &[Entity], e: &Entity, rng: &mut ChaCha8Rng) -> Passage {
    let name = |id: Option<EntityId>| id.map(|i| entities[i].name.as_str()).unwrap_or("an unknown place");
    let mut text = match e.kind {
        Kind::Country => format!("{} is a country that was first unified in {}.", e.name, e.year),
        Kind::City => format!("{} is a city in {}, first recorded in {}.", e.name, name(e.place), e.year),
        Kind::Person => format!(
            "{} (born {}) was {} {} born in {}. {} studied at {}.",
            e.name,
            e.year,
            article(&e.descriptor),
            e.descriptor,
            name(e.place),
            e.name.split(' ').next().unwrap_or(&e.name),
            name(e.alma_mater),
        ),
        Kind::University => {
            format!("{} is a university in {}, founded in {} by {}.", e.name, name(e.place), e.year, name(e.maker),)
        }
        Kind::Structure => format!(
            "{} is {} {} in {}. It was designed by {} and opened in {}.",
            e.name,
            article(&e.descriptor),
            e.descriptor,
            name(e.place),
            name(e.maker),
            e.year,
        ),
    };
    let fillers: &[&str] = if e.kind == Kind::Person { &PERSON_FILLER } else { &FILLER };
    for filler in fillers.choose_multiple(rng, 2) {
        text.push(' ');
        text.push_str(filler);
    }
    Passage { id: e.id.to_string(), title: e.name.clone(), text }
}
