// Unknown-field detection for Kubernetes objects, offline.
//
// kubernetes-models' validators check types, enums, patterns and required
// fields against the OpenAPI schemas, but like the API schemas themselves
// they accept properties no schema names: a misspelt `readinesProbe` or a
// `replica: 2` would pass, and the API server (strict field validation)
// would refuse it, or worse, silently drop it. The same packages ship a
// TypeScript declaration (.d.ts) per schema type, generated from the same
// OpenAPI documents, with every property of every type. This module reads
// those declarations (a small parser for the subset the generator emits:
// interfaces, `extends`, imports, Array<T>, unions, inline object types and
// index signatures) and walks an object against them, reporting every
// property that its type does not declare.

import fs from "node:fs";
import path from "node:path";

// --- Tokens of a generated .d.ts (comments stripped).
function tokenize(text) {
  const source = text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/[^\n]*/g, "");
  const tokens = [];
  const re = /\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[A-Za-z_$][\w$]*|-?\d+(?:\.\d+)?|=>|[{}()<>\[\];:?,|&=.])/gy;
  let match;
  re.lastIndex = 0;
  while (re.lastIndex < source.length) {
    const at = re.lastIndex;
    match = re.exec(source);
    if (match === null) {
      if (/^\s*$/.test(source.slice(at))) break;
      throw new Error(`cannot tokenize near: ${source.slice(at, at + 40)}`);
    }
    tokens.push(match[1]);
  }
  return tokens;
}

class Parser {
  constructor(tokens) {
    this.tokens = tokens;
    this.at = 0;
  }
  peek(offset = 0) {
    return this.tokens[this.at + offset];
  }
  next() {
    return this.tokens[this.at++];
  }
  expect(token) {
    const got = this.next();
    if (got !== token) throw new Error(`expected '${token}', got '${got}'`);
  }
  // type := member ('|' member)*
  type() {
    if (this.peek() === "|") this.next();
    const alternatives = [this.intersection()];
    while (this.peek() === "|") {
      this.next();
      alternatives.push(this.intersection());
    }
    return alternatives.length === 1 ? alternatives[0] : { union: alternatives };
  }
  intersection() {
    const parts = [this.postfix()];
    while (this.peek() === "&") {
      this.next();
      parts.push(this.postfix());
    }
    return parts.length === 1 ? parts[0] : { intersection: parts };
  }
  postfix() {
    let type = this.primary();
    while (this.peek() === "[" && this.peek(1) === "]") {
      this.next();
      this.next();
      type = { array: type };
    }
    return type;
  }
  primary() {
    const token = this.next();
    if (token === "{") return this.objectBody();
    if (token === "(") {
      const inner = this.type();
      this.expect(")");
      return inner;
    }
    if (/^["'\d-]/.test(token)) return { primitive: "literal" };
    if (token === "import") {
      // import("pkg").Name: only in class declarations, which are skipped.
      this.expect("(");
      this.next();
      this.expect(")");
      let name = "";
      while (this.peek() === ".") {
        this.next();
        name = this.next();
      }
      return { primitive: `import ${name}` };
    }
    let name = token;
    while (this.peek() === ".") {
      this.next();
      name += "." + this.next();
    }
    if (this.peek() === "<") {
      this.next();
      const args = [this.type()];
      while (this.peek() === ",") {
        this.next();
        args.push(this.type());
      }
      this.expect(">");
      if (name === "Array" || name === "ReadonlyArray") return { array: args[0] };
      if (name === "Record") return { object: {}, index: args[1] };
      return { primitive: name };
    }
    const primitives = ["string", "number", "boolean", "any", "unknown", "object", "null",
      "undefined", "never", "true", "false", "bigint"];
    if (primitives.includes(name)) return { primitive: name };
    return { ref: name };
  }
  // After '{': members until '}'.
  objectBody() {
    const object = { object: {}, index: null };
    while (this.peek() !== "}") {
      if (this.peek() === "[") {
        this.next();
        this.next(); // key name
        this.expect(":");
        this.type();
        this.expect("]");
        this.expect(":");
        object.index = this.type();
      } else {
        let key = this.next();
        if (/^["']/.test(key)) key = JSON.parse(key.replace(/^'|'$/g, '"'));
        if (this.peek() === "?") this.next();
        this.expect(":");
        object.object[key] = this.type();
      }
      if (this.peek() === ";" || this.peek() === ",") this.next();
    }
    this.expect("}");
    return object;
  }
}

// One .d.ts: its imports (local name -> module specifier), its interfaces
// (name -> {extends, body}) and its type aliases (name -> type).
function parseDeclarationFile(file) {
  const tokens = tokenize(fs.readFileSync(file, "utf8"));
  const parser = new Parser(tokens);
  const imports = new Map();
  const interfaces = new Map();
  const aliases = new Map();
  const reexports = new Map();
  while (parser.at < tokens.length) {
    const token = parser.next();
    if (token === "import" && parser.peek() === "{") {
      parser.next();
      const names = [];
      while (parser.peek() !== "}") {
        const name = parser.next();
        if (parser.peek() === "as") {
          parser.next();
          names.push(parser.next());
        } else {
          names.push(name);
        }
        if (parser.peek() === ",") parser.next();
      }
      parser.expect("}");
      parser.expect("from");
      const from = JSON.parse(parser.next());
      for (const name of names) imports.set(name, from);
    } else if (token === "interface") {
      const name = parser.next();
      const bases = [];
      if (parser.peek() === "extends") {
        parser.next();
        bases.push(parser.postfix());
        while (parser.peek() === ",") {
          parser.next();
          bases.push(parser.postfix());
        }
      }
      parser.expect("{");
      interfaces.set(name, { bases, body: parser.objectBody() });
    } else if (token === "type" && parser.tokens[parser.at - 2] === "export" &&
               parser.peek() === "{") {
      // export type { ILocal as IIoK8s...Long, ... }: the names others import.
      parser.next();
      while (parser.peek() !== "}") {
        const local = parser.next();
        let exported = local;
        if (parser.peek() === "as") {
          parser.next();
          exported = parser.next();
        }
        reexports.set(exported, local);
        if (parser.peek() === ",") parser.next();
      }
      parser.expect("}");
    } else if (token === "type" && parser.tokens[parser.at - 2] === "export") {
      const name = parser.next();
      parser.expect("=");
      aliases.set(name, parser.type());
    } else if (token === "class") {
      // Skip the class declaration's body: it repeats the interface.
      while (parser.next() !== "{");
      let depth = 1;
      while (depth > 0) {
        const t = parser.next();
        if (t === "{") depth++;
        if (t === "}") depth--;
      }
    }
  }
  return { file, imports, interfaces, aliases, reexports };
}

export class Declarations {
  constructor(nodeModules) {
    this.nodeModules = nodeModules;
    this.files = new Map();
    this.resolved = new Map();
  }
  file(file) {
    if (!this.files.has(file)) this.files.set(file, parseDeclarationFile(file));
    return this.files.get(file);
  }
  moduleFile(fromFile, specifier) {
    let base;
    if (specifier.startsWith(".")) {
      base = path.resolve(path.dirname(fromFile), specifier);
    } else {
      base = path.join(this.nodeModules, specifier);
    }
    base = base.replace(/\.js$/, "");
    for (const candidate of [`${base}.d.ts`, path.join(base, "index.d.ts")]) {
      if (fs.existsSync(candidate)) return candidate;
    }
    throw new Error(`cannot find declarations of ${specifier} (from ${fromFile})`);
  }
  // The type a name means in `file`: a local interface or alias, or the
  // (only) exported interface of the module it is imported from.
  resolveName(file, name) {
    const key = `${file}#${name}`;
    if (this.resolved.has(key)) return this.resolved.get(key);
    const declarations = this.file(file);
    let type;
    if (declarations.interfaces.has(name)) {
      const { bases, body } = declarations.interfaces.get(name);
      type = { object: { ...body.object }, index: body.index, file, bases };
    } else if (declarations.aliases.has(name)) {
      type = { alias: declarations.aliases.get(name), file };
    } else if (declarations.imports.has(name)) {
      const specifier = declarations.imports.get(name);
      if (specifier === "@kubernetes-models/base") {
        // TypeMeta: apiVersion and kind, listed again by every model.
        type = { object: { apiVersion: { primitive: "string" }, kind: { primitive: "string" } },
                 index: null, file, bases: [] };
      } else {
        const target = this.moduleFile(file, specifier);
        const local = this.file(target).reexports.get(name) ?? name;
        type = this.resolveName(target, local);
      }
    } else {
      throw new Error(`${file}: unknown type ${name}`);
    }
    this.resolved.set(key, type);
    return type;
  }
  // The members of an object type, with its bases' members merged in.
  members(type, file) {
    const object = { ...type.object };
    let index = type.index;
    for (const base of type.bases ?? []) {
      const resolved = this.concrete(base, type.file ?? file);
      if (resolved.type.object) {
        const inherited = this.members(resolved.type, resolved.file);
        for (const [key, value] of Object.entries(inherited.object)) {
          if (!(key in object)) object[key] = { ...value, file: value.file ?? resolved.file };
        }
        index = index ?? inherited.index;
      }
    }
    return { object, index };
  }
  // Follows references and aliases to an object, array, union or primitive.
  concrete(type, file) {
    for (let hops = 0; hops < 50; hops++) {
      if (type.ref) {
        const resolved = this.resolveName(type.file ?? file, type.ref);
        file = resolved.file;
        type = resolved;
      } else if (type.alias) {
        file = type.file;
        type = type.alias;
      } else {
        return { type, file: type.file ?? file };
      }
    }
    throw new Error("type reference loop");
  }
}

// Every path in `value` that `rootFile`'s exported interface does not declare.
export function unknownFields(declarations, rootFile, value) {
  const problems = [];
  const root = declarations.file(rootFile);
  const rootName = [...root.interfaces.keys()][0];
  if (rootName === undefined) throw new Error(`${rootFile}: no interface`);
  walk(declarations, { ref: rootName }, rootFile, value, "", problems);
  return problems;
}

function walk(declarations, type, file, value, where, problems) {
  if (value === null || value === undefined) return;
  const { type: concrete, file: at } = declarations.concrete(type, file);
  if (concrete.union || concrete.intersection) {
    // Unions of the generator are scalar ones (IntOrString, enums) or an
    // object with null; walk the object alternative when the value is one.
    const alternatives = concrete.union ?? concrete.intersection;
    for (const alternative of alternatives) {
      const resolved = declarations.concrete(alternative, at);
      if (Array.isArray(value) && resolved.type.array) {
        return walk(declarations, resolved.type, resolved.file, value, where, problems);
      }
      if (typeof value === "object" && !Array.isArray(value) && resolved.type.object) {
        return walk(declarations, resolved.type, resolved.file, value, where, problems);
      }
    }
    return;
  }
  if (concrete.array) {
    if (!Array.isArray(value)) return;
    value.forEach((item, i) => walk(declarations, concrete.array, at, item, `${where}[${i}]`,
                                    problems));
    return;
  }
  if (concrete.object) {
    if (typeof value !== "object" || Array.isArray(value)) return;
    const { object, index } = declarations.members(concrete, at);
    for (const [key, child] of Object.entries(value)) {
      const path = where === "" ? key : `${where}.${key}`;
      if (key in object) {
        walk(declarations, object[key], object[key].file ?? at, child, path, problems);
      } else if (index) {
        walk(declarations, index, at, child, path, problems);
      } else {
        problems.push(path);
      }
    }
  }
}
