//! An OpenQASM 2.0 reader for measurement-free circuits.
//!
//! Accepted: the `OPENQASM 2.0;` header, `include "qelib1.inc";`, `qreg`s (several are laid out
//! one after the other, in declaration order, as Qiskit does: the first register holds qubit 0),
//! `creg`s (declared and otherwise ignored), `barrier` (ignored), and the gates of
//! [`gates::GATE_NAMES`] with parameter expressions (numbers, `pi`, `+ - * / ^`, unary minus,
//! parentheses, `sin cos tan exp ln sqrt`). A gate applied to whole registers is broadcast as
//! OpenQASM specifies (`h q;`, `cx a, b;` pairwise).
//!
//! Rejected with an error naming the line: `measure`, `reset` and `if` (the simulator computes
//! the state before any measurement; measurement would make the result random), `gate`/`opaque`
//! definitions, unknown gates, a wrong number of parameters or qubits, a qubit used twice in one
//! gate, a qubit or register out of range, and syntax errors. The whole file is checked before
//! the simulation starts, so a bad circuit costs no communication.

use std::fmt;

use crate::gates::{self, Op};

/// A parse error at a line of the file (1-based).
#[derive(Debug, Clone, PartialEq)]
pub struct QasmError {
    pub line: usize,
    pub msg: String,
}

impl fmt::Display for QasmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.msg)
    }
}

type Res<T> = std::result::Result<T, QasmError>;

fn err<T>(line: usize, msg: impl Into<String>) -> Res<T> {
    Err(QasmError {
        line,
        msg: msg.into(),
    })
}

/// A gate of the circuit, lowered to elementary operations.
#[derive(Debug, Clone)]
pub struct Gate {
    /// The QASM name (for reports).
    pub name: String,
    /// Line of the statement.
    pub line: usize,
    pub ops: Vec<Op>,
}

/// A parsed circuit.
#[derive(Debug, Clone)]
pub struct Circuit {
    /// Total qubits over all registers.
    pub qubits: usize,
    pub gates: Vec<Gate>,
    /// `creg`s and `barrier`s that were ignored (reported once, not an error).
    pub ignored: Vec<String>,
}

impl Circuit {
    /// The elementary operations, each with its gate.
    pub fn ops(&self) -> impl Iterator<Item = (&Op, &Gate)> {
        self.gates
            .iter()
            .flat_map(|g| g.ops.iter().map(move |o| (o, g)))
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Id(String),
    Num(f64),
    Str(String),
    Sym(char),
    Arrow,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Id(s) => write!(f, "`{s}`"),
            Tok::Num(x) => write!(f, "`{x}`"),
            Tok::Str(s) => write!(f, "\"{s}\""),
            Tok::Sym(c) => write!(f, "`{c}`"),
            Tok::Arrow => f.write_str("`->`"),
        }
    }
}

fn lex(src: &str) -> Res<Vec<(Tok, usize)>> {
    let mut out = Vec::new();
    for (ln, text) in src.lines().enumerate() {
        let line = ln + 1;
        let b = text.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let c = b[i] as char;
            if c.is_ascii_whitespace() {
                i += 1;
            } else if text[i..].starts_with("//") {
                break;
            } else if text[i..].starts_with("/*") {
                return err(line, "block comments (/* */) are not OpenQASM 2");
            } else if c.is_ascii_alphabetic() || c == '_' {
                let s = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                out.push((Tok::Id(text[s..i].to_string()), line));
            } else if c.is_ascii_digit()
                || (c == '.' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
            {
                let s = i;
                while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                    i += 1;
                }
                if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
                    let mut j = i + 1;
                    if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
                        j += 1;
                    }
                    if j < b.len() && b[j].is_ascii_digit() {
                        i = j;
                        while i < b.len() && b[i].is_ascii_digit() {
                            i += 1;
                        }
                    }
                }
                match text[s..i].parse::<f64>() {
                    Ok(x) => out.push((Tok::Num(x), line)),
                    Err(_) => return err(line, format!("bad number `{}`", &text[s..i])),
                }
            } else if c == '"' {
                let Some(end) = text[i + 1..].find('"') else {
                    return err(line, "unterminated string");
                };
                out.push((Tok::Str(text[i + 1..i + 1 + end].to_string()), line));
                i += end + 2;
            } else if text[i..].starts_with("->") {
                out.push((Tok::Arrow, line));
                i += 2;
            } else if "[](),;+-*/^{}".contains(c) {
                out.push((Tok::Sym(c), line));
                i += 1;
            } else {
                return err(
                    line,
                    format!(
                        "unexpected character `{}`",
                        &text[i..].chars().next().unwrap_or(c)
                    ),
                );
            }
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    at: usize,
    /// Line of the last token (for errors at the end of the file).
    last_line: usize,
    /// (name, first qubit, size)
    qregs: Vec<(String, usize, usize)>,
    cregs: Vec<String>,
}

/// A gate argument: one qubit, or a whole register (broadcast).
enum Arg {
    One(usize),
    Reg(usize, usize),
}

impl Parser {
    fn line(&self) -> usize {
        self.toks.get(self.at).map_or(self.last_line, |t| t.1)
    }
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at).map(|t| &t.0)
    }
    fn next(&mut self, what: &str) -> Res<Tok> {
        match self.toks.get(self.at) {
            Some((t, _)) => {
                self.at += 1;
                Ok(t.clone())
            }
            None => err(
                self.last_line,
                format!("unexpected end of file, expected {what}"),
            ),
        }
    }
    fn sym(&mut self, c: char) -> Res<()> {
        let line = self.line();
        match self.next(&format!("`{c}`"))? {
            Tok::Sym(d) if d == c => Ok(()),
            t => err(line, format!("expected `{c}`, found {t}")),
        }
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Sym(c)) {
            self.at += 1;
            true
        } else {
            false
        }
    }
    fn ident(&mut self, what: &str) -> Res<String> {
        let line = self.line();
        match self.next(what)? {
            Tok::Id(s) => Ok(s),
            t => err(line, format!("expected {what}, found {t}")),
        }
    }
    fn index(&mut self) -> Res<usize> {
        let line = self.line();
        match self.next("an index")? {
            Tok::Num(x) if x >= 0.0 && x.fract() == 0.0 && x < 1e15 => Ok(x as usize),
            t => err(
                line,
                format!("expected a non-negative integer index, found {t}"),
            ),
        }
    }

    // expressions: sum := term (('+'|'-') term)*; term := unary (('*'|'/') unary)*;
    // unary := '-' unary | power; power := atom ('^' unary)?
    fn expr(&mut self) -> Res<f64> {
        let mut v = self.term()?;
        loop {
            if self.eat('+') {
                v += self.term()?;
            } else if self.eat('-') {
                v -= self.term()?;
            } else {
                return Ok(v);
            }
        }
    }
    fn term(&mut self) -> Res<f64> {
        let mut v = self.unary()?;
        loop {
            if self.eat('*') {
                v *= self.unary()?;
            } else if self.eat('/') {
                v /= self.unary()?;
            } else {
                return Ok(v);
            }
        }
    }
    fn unary(&mut self) -> Res<f64> {
        if self.eat('-') {
            return Ok(-self.unary()?);
        }
        if self.eat('+') {
            return self.unary();
        }
        let base = self.atom()?;
        if self.eat('^') {
            return Ok(base.powf(self.unary()?));
        }
        Ok(base)
    }
    fn atom(&mut self) -> Res<f64> {
        let line = self.line();
        match self.next("an expression")? {
            Tok::Num(x) => Ok(x),
            Tok::Sym('(') => {
                let v = self.expr()?;
                self.sym(')')?;
                Ok(v)
            }
            Tok::Id(s) if s == "pi" => Ok(std::f64::consts::PI),
            Tok::Id(s) => {
                let f: fn(f64) -> f64 = match s.as_str() {
                    "sin" => f64::sin,
                    "cos" => f64::cos,
                    "tan" => f64::tan,
                    "exp" => f64::exp,
                    "ln" => f64::ln,
                    "sqrt" => f64::sqrt,
                    _ => return err(line, format!("unknown identifier `{s}` in an expression")),
                };
                self.sym('(')?;
                let v = self.expr()?;
                self.sym(')')?;
                Ok(f(v))
            }
            t => err(line, format!("expected an expression, found {t}")),
        }
    }

    fn qarg(&mut self) -> Res<Arg> {
        let line = self.line();
        let name = self.ident("a qubit (`q[0]`) or a register")?;
        let Some(&(_, first, size)) = self.qregs.iter().find(|r| r.0 == name) else {
            return if self.cregs.contains(&name) {
                err(
                    line,
                    format!("`{name}` is a classical register, not a qubit register"),
                )
            } else {
                err(line, format!("unknown quantum register `{name}`"))
            };
        };
        if !self.eat('[') {
            return Ok(Arg::Reg(first, size));
        }
        let i = self.index()?;
        self.sym(']')?;
        if i >= size {
            return err(
                line,
                format!("qubit {name}[{i}] out of range (qreg {name} has {size} qubits)"),
            );
        }
        Ok(Arg::One(first + i))
    }

    fn args(&mut self) -> Res<Vec<Arg>> {
        let mut v = vec![self.qarg()?];
        while self.eat(',') {
            v.push(self.qarg()?);
        }
        self.sym(';')?;
        Ok(v)
    }

    fn reg_decl(&mut self) -> Res<(String, usize)> {
        let line = self.line();
        let name = self.ident("a register name")?;
        self.sym('[')?;
        let n = self.index()?;
        self.sym(']')?;
        self.sym(';')?;
        if n == 0 {
            return err(line, format!("register `{name}` has size 0"));
        }
        if self.qregs.iter().any(|r| r.0 == name) || self.cregs.contains(&name) {
            return err(line, format!("register `{name}` declared twice"));
        }
        Ok((name, n))
    }

    fn gate(&mut self, name: String, line: usize, out: &mut Vec<Gate>) -> Res<()> {
        let Some((np, nq)) = gates::arity(&name) else {
            return err(
                line,
                format!("unknown gate `{name}` (supported: {})", gates::GATE_NAMES),
            );
        };
        let mut params = Vec::new();
        // `name(…)`; `name()` is no parameters
        if self.eat('(') && !self.eat(')') {
            params.push(self.expr()?);
            while self.eat(',') {
                params.push(self.expr()?);
            }
            self.sym(')')?;
        }
        if params.len() != np {
            return err(
                line,
                format!(
                    "gate `{name}` takes {np} parameter(s), got {}",
                    params.len()
                ),
            );
        }
        if let Some(p) = params.iter().find(|p| !p.is_finite()) {
            return err(line, format!("gate `{name}`: parameter evaluates to {p}"));
        }
        let args = self.args()?;
        if args.len() != nq {
            return err(
                line,
                format!("gate `{name}` acts on {nq} qubit(s), got {}", args.len()),
            );
        }
        // broadcast: every register argument must have the same size
        let mut reps = None;
        for a in &args {
            if let Arg::Reg(_, n) = *a {
                if reps.is_some_and(|r| r != n) {
                    return err(line, format!("gate `{name}`: registers of different sizes"));
                }
                reps = Some(n);
            }
        }
        for k in 0..reps.unwrap_or(1) {
            let q: Vec<usize> = args
                .iter()
                .map(|a| match *a {
                    Arg::One(q) => q,
                    Arg::Reg(f, _) => f + k,
                })
                .collect();
            if (1..q.len()).any(|i| q[..i].contains(&q[i])) {
                return err(line, format!("gate `{name}` uses one qubit twice"));
            }
            let mut ops = Vec::new();
            if !gates::lower(&name, &params, &q, &mut ops) {
                return err(line, format!("unknown gate `{name}`"));
            }
            out.push(Gate {
                name: name.clone(),
                line,
                ops,
            });
        }
        Ok(())
    }
}

/// Parse a QASM 2 source.
pub fn parse(src: &str) -> Res<Circuit> {
    let toks = lex(src)?;
    let last_line = toks.last().map_or(1, |t| t.1);
    let mut p = Parser {
        toks,
        at: 0,
        last_line,
        qregs: Vec::new(),
        cregs: Vec::new(),
    };
    let mut gates = Vec::new();
    let mut ignored = Vec::new();
    let mut qubits = 0usize;
    while p.peek().is_some() {
        let line = p.line();
        let head = p.ident("a statement")?;
        match head.as_str() {
            "OPENQASM" => {
                let v = p.next("a version")?;
                if v != Tok::Num(2.0) {
                    return err(line, format!("OPENQASM {v}: only version 2.0 is supported"));
                }
                p.sym(';')?;
            }
            "include" => {
                let f = p.next("a file name")?;
                if f != Tok::Str("qelib1.inc".into()) {
                    return err(
                        line,
                        format!("include {f}: only \"qelib1.inc\" is supported"),
                    );
                }
                p.sym(';')?;
            }
            "qreg" => {
                let (name, n) = p.reg_decl()?;
                p.qregs.push((name, qubits, n));
                qubits += n;
                if qubits > 60 {
                    return err(line, format!("{qubits} qubits: at most 60 are supported"));
                }
            }
            "creg" => {
                let (name, _) = p.reg_decl()?;
                ignored.push(format!("line {line}: creg {name} (no measurements)"));
                p.cregs.push(name);
            }
            "barrier" => {
                p.args()?;
            }
            "measure" | "reset" | "if" => {
                return err(
                    line,
                    format!(
                        "`{head}` is not supported: the simulator computes the state of a \
                         measurement-free circuit (remove measurements, resets and conditions)"
                    ),
                )
            }
            "gate" | "opaque" => {
                return err(
                    line,
                    format!(
                        "`{head}` definitions are not supported: decompose the circuit into \
                         the standard gates first (e.g. Qiskit's transpile with basis_gates)"
                    ),
                )
            }
            _ => {
                if p.qregs.is_empty() {
                    return err(line, format!("gate `{head}` before any qreg"));
                }
                p.gate(head, line, &mut gates)?;
            }
        }
    }
    if qubits == 0 {
        return err(p.last_line, "no qreg declared");
    }
    Ok(Circuit {
        qubits,
        gates,
        ignored,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(src: &str) -> QasmError {
        parse(src).expect_err("should fail")
    }

    #[test]
    fn parses_registers_broadcast_and_expressions() {
        let c = parse(
            "OPENQASM 2.0;\ninclude \"qelib1.inc\";\n// comment\nqreg a[2];\nqreg b[3];\ncreg c[5];\n\
             h a;\ncx a, b[0:0];",
        );
        // `b[0:0]` is not QASM 2
        assert_eq!(c.unwrap_err().line, 8);
        let c = parse(
            "OPENQASM 2.0;\nqreg a[2];\nqreg b[2];\nh a;\ncx a, b;\nbarrier a;\n\
             u(pi/2, -(1+2)*pi/4, 2^3) b[1];\nrz(-pi) a[0];\n",
        )
        .unwrap();
        assert_eq!(c.qubits, 4);
        // h a → 2 gates; cx a, b → 2 gates (pairwise); u; rz
        assert_eq!(c.gates.len(), 6);
        assert_eq!(
            c.gates[2].ops,
            vec![Op::U {
                target: 2,
                controls: vec![0],
                m: c.gates[2].ops_m()
            }]
        );
        assert_eq!(c.gates[3].line, 5);
        let Op::U { target, m, .. } = &c.gates[4].ops[0] else {
            panic!()
        };
        assert_eq!(*target, 3);
        assert_eq!(
            *m,
            gates::u3(
                std::f64::consts::FRAC_PI_2,
                -0.75 * std::f64::consts::PI,
                8.0
            )
        );
    }

    impl Gate {
        fn ops_m(&self) -> gates::Mat2 {
            match &self.ops[0] {
                Op::U { m, .. } => *m,
                Op::Swap(..) => panic!(),
            }
        }
    }

    #[test]
    fn errors_name_the_line() {
        let h = "OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[3];\n";
        let x = e(&format!("{h}h q[0];\nfoo q[1];\n"));
        assert_eq!(x.line, 5);
        assert!(x.msg.contains("unknown gate `foo`"), "{x}");
        let x = e(&format!("{h}cx q[0],\n  q[3];\n"));
        assert_eq!(x.line, 5);
        assert!(x.msg.contains("q[3] out of range"), "{x}");
        let x = e(&format!("{h}h q[0]\nh q[1];\n"));
        assert_eq!(x.line, 5);
        assert!(x.msg.contains("expected `;`"), "{x}");
        let x = e(&format!("{h}creg c[3];\nmeasure q -> c;\n"));
        assert_eq!(x.line, 5);
        assert!(x.msg.contains("measure"), "{x}");
        let x = e(&format!("{h}rx q[0];\n"));
        assert!(x.msg.contains("1 parameter"), "{x}");
        let x = e(&format!("{h}cx q[1], q[1];\n"));
        assert!(x.msg.contains("twice"), "{x}");
        let x = e(&format!("{h}rz(pi/) q[1];\n"));
        assert_eq!(x.line, 4);
        let x = e(&format!("{h}rz(foo) q[1];\n"));
        assert!(x.msg.contains("unknown identifier `foo`"), "{x}");
        let x = e(&format!("{h}h r[0];\n"));
        assert!(x.msg.contains("unknown quantum register `r`"), "{x}");
        let x = e("OPENQASM 3.0;\n");
        assert_eq!(x.line, 1);
        let x = e(&format!("{h}gate g a {{ h a; }}\n"));
        assert!(x.msg.contains("definitions"), "{x}");
        let x = e(&format!("{h}h q[0];\nrz(1/0) q[1];\n"));
        assert_eq!(x.line, 5);
        let x = e(&format!("{h}h q[0];\nh q[1];\ncx q[0], q[1]"));
        assert_eq!(x.line, 6);
        assert!(x.msg.contains("end of file"), "{x}");
        let x = e("OPENQASM 2.0;\nh q[0];\n");
        assert!(x.msg.contains("before any qreg"), "{x}");
    }
}
